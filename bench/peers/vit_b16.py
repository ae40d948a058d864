#!/usr/bin/python3
"""PyTorch peer: CLIP ViT-B/16 at 224 px (the vision tower), random weights.

Written from the architecture of OpenAI's CLIP (openai/CLIP clip/model.py VisionTransformer, commit
ea41722f9fe6bb81189f41ab6c306e77e930c2af):
a 16x16 stride-16 patch convolution without bias, a class token, 197 learned positions, a
LayerNorm before the blocks (ln_pre), 12 pre-LN blocks (multi-head attention with 12 heads
of 64, then an MLP 768 -> 3072 -> 768 with quick_gelu x*sigmoid(1.702x)), a final LayerNorm
over every token (CLIP's ln_post takes the class token only; the difference is negligible
next to the blocks). Usage: vit_b16.py --iters N [--threads T] [--batch B]; prints one JSON line.
"""
import sys

import vit_whisper_common

A = vit_whisper_common.args(batch=8)

import torch  # noqa: E402  (after the re-exec that sets the library path)
from torch import nn  # noqa: E402

D, HEADS, MLP, LAYERS, PATCH, SIZE = 768, 12, 3072, 12, 16, 224


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, MLP), nn.Linear(MLP, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) * (D // HEADS) ** -0.5, dim=-1)
        x = x + self.out((att @ v).transpose(1, 2).reshape(b, t, D))
        h = self.fc1(self.ln2(x))
        return x + self.fc2(h * torch.sigmoid(1.702 * h))


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, D, PATCH, PATCH, bias=False)
        self.cls = nn.Parameter(torch.randn(D) * 0.02)
        self.pos = nn.Parameter(torch.randn((SIZE // PATCH) ** 2 + 1, D) * 0.02)
        self.ln_pre, self.ln_post = nn.LayerNorm(D), nn.LayerNorm(D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)  # [b, 196, D]
        x = torch.cat([self.cls.expand(x.shape[0], 1, D), x], dim=1) + self.pos
        x = self.ln_pre(x)
        for blk in self.blocks:
            x = blk(x)
        return self.ln_post(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = ViT().eval()
    img = torch.randn(A.batch, 3, SIZE, SIZE)
    vit_whisper_common.run(f"vit-b16-224-batch{A.batch}", model, img, A.batch, A)
    sys.exit(0)
