#!/usr/bin/python3
"""Independent reference for the SLA mode (dataplane/planner/sla.go), written from Dynamo's
profiler and planner, not from our Go code:

- ai-dynamo/dynamo benchmarks/profiler/profile_sla.py (TTFT vs ISL: np.polyfit degree 2;
  prefill thpt/GPU = isl / ttft / tp * 1000; the queue bounds max(0.1, ttft*1.2/TTFT - 1) and
  max(0.1, ttft*0.8/TTFT - 1); the KV bounds min(1, kv + 0.2) / max(0.1, kv - 0.2));
- components/planner/src/dynamo/planner/utils/perf_interpolation.py (ITL over KV use and
  context; the best decode throughput under an ITL target).

Dynamo interpolates ITL on a grid (scipy griddata); we fit itl = a + b*kv + c*ctx + d*kv*ctx by
least squares (np.linalg.lstsq here) and search KV use in steps of 0.01. Pool sizes: prefill =
ceil(waiting prompt tokens / (TTFT target s) / engine prefill tokens/s), decode =
ceil(requests / (kv * kv_tokens / ctx)), both at least 1.

Run: /usr/bin/python3 sla_reference.py (Debian python3-numpy)  (writes sla_profile.json and sla_expected.json beside it)
"""
import json
import math
import os
import random

import numpy as np

rng = random.Random(3)
KV_TOKENS, P_GPUS, D_GPUS = 262144, 1, 2

prefill = []
for isl in range(100, 8100, 1000):
    ttft = 2e-6 * isl * isl + 0.04 * isl + 12 + rng.uniform(-1, 1)
    prefill.append({"isl": isl, "ttft_ms": round(ttft, 4)})
decode = []
for isl, osl in [(1000, 200), (3000, 200), (6000, 400)]:
    ctx = isl + osl / 2
    for conc in [1, 4, 16, 64, 128]:
        kv = conc * ctx / KV_TOKENS
        if kv > 1:
            continue
        itl = 6 + 9 * kv + 0.0008 * ctx + 0.0015 * kv * ctx + rng.uniform(-0.2, 0.2)
        decode.append({"concurrency": conc, "isl": isl, "osl": osl, "context": ctx, "kv_usage": kv,
                       "itl_ms": round(itl, 4), "tokens_per_s": round(conc * 1000 / itl, 4)})

x = np.array([p["isl"] for p in prefill], dtype=float)
y = np.array([p["ttft_ms"] for p in prefill])
ttft_fit = np.polyfit(x, y, 2)  # a, b, c
A = np.array([[1, d["kv_usage"], d["context"], d["kv_usage"] * d["context"]] for d in decode])
itl_fit, *_ = np.linalg.lstsq(A, np.array([d["itl_ms"] for d in decode]), rcond=None)


def ttft(isl):
    return float(np.polyval(ttft_fit, isl))


def itl(kv, ctx):
    return float(itl_fit[0] + itl_fit[1] * kv + itl_fit[2] * ctx + itl_fit[3] * kv * ctx)


def decode_at(target, ctx):
    for i in range(100, 0, -1):
        kv = i / 100
        v = itl(kv, ctx)
        if 0 < v <= target:
            return kv, kv * KV_TOKENS / ctx * 1000 / v / D_GPUS, True
    return 0, 0, False


cases = []
for isl, osl, t_ttft, t_itl in [(3000, 300, 200, 20), (3000, 300, 120, 12), (6000, 200, 400, 30), (1000, 100, 10, 3)]:
    ctx = isl + osl / 2
    tt = ttft(isl)
    kv, tok, ok = decode_at(t_itl, ctx)
    if not ok:
        kv = 0.01
        tok = kv * KV_TOKENS / ctx * 1000 / itl(kv, ctx) / D_GPUS
    rec = {"isl": isl, "osl": osl, "ttft": t_ttft, "itl": t_itl,
           "ttft_ms": tt, "prefill_tokens_per_gpu": isl / tt * 1000 / P_GPUS, "ttft_met": tt <= t_ttft,
           "itl_ms": itl(kv, ctx), "decode_tokens_per_gpu": tok, "decode_kv": kv, "itl_met": ok,
           "prefill_queue_up": max(0.1, t_ttft * 1.2 / tt - 1), "prefill_queue_down": max(0.1, t_ttft * 0.8 / tt - 1),
           "decode_kv_up": min(1, kv + 0.2), "decode_kv_down": max(0.1, kv - 0.2), "needed": []}
    if ok:
        rate = isl / tt * 1000
        per_decode = kv * KV_TOKENS / ctx
        for tokens, reqs in [(0, 0), (20000, 50), (150000, 900), (1e6, 5000)]:
            rec["needed"].append({"prefill_tokens": tokens, "decode_requests": reqs,
                                  "prefill": max(1, math.ceil(tokens / (t_ttft / 1000) / rate)),
                                  "decode": max(1, math.ceil(reqs / per_decode))})
    cases.append(rec)

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "sla_profile.json"), "w") as f:
    json.dump({"endpoint": "synthetic", "prefill_gpus": P_GPUS, "decode_gpus": D_GPUS, "kv_tokens": KV_TOKENS,
               "prefill": prefill, "decode": decode}, f, indent=1)
with open(os.path.join(here, "sla_expected.json"), "w") as f:
    json.dump({"ttft_fit": list(ttft_fit), "itl_fit": list(itl_fit), "cases": cases}, f, indent=1)
