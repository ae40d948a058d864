"""Loads a prompt_embeds file as vLLM does (torch.load, weights_only=True, on the CPU) and
prints dtype, shape and values, to check transfer.PromptEmbeds against real PyTorch:
    /usr/bin/python3 load_prompt_embeds.py FILE...
"""
import sys
import torch

for path in sys.argv[1:]:
    t = torch.load(path, weights_only=True, map_location=torch.device("cpu"))
    assert isinstance(t, torch.Tensor), type(t)
    print(path, t.dtype, tuple(t.shape), t.is_contiguous(), t.float().flatten().tolist())
