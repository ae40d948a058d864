#!/usr/bin/python3
"""PyTorch peer: the Whisper-base audio encoder on 30 s (80 x 3000 log-mel), random weights.

Written from the architecture of openai/whisper (whisper/model.py AudioEncoder, commit
fdf63e51dc3089e10d72fd25ac04ffe22f86543e): two 1-D
convolutions of width 3 (80 -> 512, then 512 -> 512 with stride 2), each followed by GELU,
sinusoidal positions for the 1500 frames, 6 pre-LN blocks (8 heads of 64; the key projection
has no bias; an MLP 512 -> 2048 -> 512 with exact GELU), a final LayerNorm.
Usage: whisper_base_encoder.py --iters N [--threads T] [--batch B]; prints one JSON line.
"""
import math
import sys

import vit_whisper_common

A = vit_whisper_common.args(batch=4)

import torch  # noqa: E402  (after the re-exec that sets the library path)
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

D, HEADS, MLP, LAYERS, MELS, CTX = 512, 8, 2048, 6, 80, 1500


def sinusoids(length, channels):
    inc = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.k, self.v, self.out = nn.Linear(D, D), nn.Linear(D, D, bias=False), nn.Linear(D, D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, MLP), nn.Linear(MLP, D)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = (p(h).view(b, t, HEADS, D // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) * (D // HEADS) ** -0.5, dim=-1)
        x = x + self.out((att @ v).transpose(1, 2).reshape(b, t, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(MELS, D, 3, padding=1)
        self.conv2 = nn.Conv1d(D, D, 3, stride=2, padding=1)
        self.register_buffer("pos", sinusoids(CTX, D))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_post = nn.LayerNorm(D)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.ln_post(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Encoder().eval()
    mel = torch.randn(A.batch, MELS, 2 * CTX)
    vit_whisper_common.run(f"whisper-base-encoder-30s-batch{A.batch}", model, mel, A.batch, A)
    sys.exit(0)
