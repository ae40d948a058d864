#!/usr/bin/env python3
"""Writes profile.npz, a perf profile in Dynamo's format, with numpy itself (an independent
writer for the mocker's .npz/.npy reader), and profile_compressed.npz, the same arrays
deflated, one of them big-endian and decode_itl in Fortran order; prints the values the tests
expect.
Run by hand: /usr/bin/python3 gen_profile.py (Debian's python3-numpy)."""
import numpy as np

prefill_isl = np.array([128, 1024, 4096, 16384], dtype=np.int64)
prefill_ttft_ms = np.array([20.0, 35.0, 110.0, 600.0], dtype=np.float64)
decode_active_kv_tokens = np.array([1000.0, 100000.0, 400000.0], dtype=np.float32)
decode_context_length = np.array([256, 4096], dtype=np.int32)
decode_itl = np.array([[6.0, 7.0], [12.0, 20.0], [30.0, 45.0]], dtype=np.float64)
np.savez("profile.npz", prefill_isl=prefill_isl, prefill_ttft_ms=prefill_ttft_ms,
         decode_active_kv_tokens=decode_active_kv_tokens, decode_context_length=decode_context_length,
         decode_itl=decode_itl)
# Same values, as other writers may store them: deflated, big-endian, column-major.
np.savez_compressed("profile_compressed.npz", prefill_isl=prefill_isl,
                    prefill_ttft_ms=prefill_ttft_ms.astype(">f8"),
                    decode_active_kv_tokens=decode_active_kv_tokens,
                    decode_context_length=decode_context_length,
                    decode_itl=np.asfortranarray(decode_itl))
# The same expectations, by numpy's own interpolation.
print("prefill(2560) =", np.interp(2560, prefill_isl, prefill_ttft_ms))
kv, ctx = 43520.0, 2176.0  # a batch of 20 sequences of 2,176 tokens: inside the first cell
lo = np.interp(ctx, decode_context_length, decode_itl[0])
hi = np.interp(ctx, decode_context_length, decode_itl[1])
print("decode(43520 kv, 2176 ctx) = %.9f" % (lo + (hi - lo) * (kv - 1000) / (100000 - 1000)))
