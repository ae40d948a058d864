"""Writes torch.save files of known tensors with real PyTorch, for transfer's tests.

Run with Debian's python3-torch (1.13.1+dfsg-4, torch.__version__ 1.13.0a0):
    /usr/bin/python3 make_torch_vectors.py
Each tensor holds arange(n) * 0.25 - 1 in its dtype, shaped as named.
"""
import torch

for name, dtype, shape in [("bf16", torch.bfloat16, (3, 5)), ("f32", torch.float32, (2, 4)), ("f16", torch.float16, (4, 2))]:
    n = shape[0] * shape[1]
    t = (torch.arange(n, dtype=torch.float32) * 0.25 - 1).to(dtype).reshape(shape)
    torch.save(t, f"torch_{name}.pt")
    print(name, t.dtype, tuple(t.shape))
