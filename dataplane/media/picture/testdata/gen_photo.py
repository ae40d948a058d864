#!/usr/bin/env python3
"""Writes photo_1024x768.jpg: a deterministic, photo-like 1024x768 JPEG (quality 90, 4:2:0) with
the entropy of a real photo (~185 KB; a synthetic gradient of the same size is ~55 KB and decodes
twice as fast), and photo_refs.json: what Pillow + torchvision make of it for CLIP-336
(openai/CLIP's _transform: Resize(336, BICUBIC) on the shortest side, CenterCrop(336), ToTensor,
Normalize with CLIP's mean/std), as sha256 hashes of the 8-bit crop and of the float32 tensor.

Run with Debian bookworm's python3-pil (Pillow 9.4, libjpeg-turbo 2.1.5), python3-numpy and
python3-torchvision 0.14:

    /usr/bin/python3 dataplane/media/picture/testdata/gen_photo.py

The scene: a sky gradient, fractal-noise hills (octaves of bilinearly upsampled noise), blocks
with windows, foliage-like texture, rows of text-like strokes, sensor noise and a vignette.
numpy's legacy RandomState is used because its stream is fixed across numpy versions."""
import hashlib, io, json, os
import numpy as np
from PIL import Image, ImageDraw

HERE = os.path.dirname(os.path.abspath(__file__))
W, H = 1024, 768
rs = np.random.RandomState(26)


def octave_noise(h, w, cells, amp):
    """Noise of `cells` cells across, bilinearly upsampled to h x w."""
    g = rs.standard_normal((cells * h // w + 2, cells + 2)).astype(np.float64)
    ys = np.linspace(0, g.shape[0] - 2, h)
    xs = np.linspace(0, g.shape[1] - 2, w)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    a = g[y0][:, x0] * (1 - fx) + g[y0][:, x0 + 1] * fx
    b = g[y0 + 1][:, x0] * (1 - fx) + g[y0 + 1][:, x0 + 1] * fx
    return amp * (a * (1 - fy) + b * fy)


def fractal(h, w, base, octaves, amp, decay=0.55):
    out = np.zeros((h, w))
    for o in range(octaves):
        out += octave_noise(h, w, base << o, amp * decay**o)
    return out


yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
img = np.zeros((H, W, 3))
# Sky: a vertical gradient with soft clouds.
t = yy / H
clouds = fractal(H, W, 4, 6, 18)
img[..., 0] = 110 + 90 * t + clouds
img[..., 1] = 150 + 60 * t + clouds
img[..., 2] = 230 - 30 * t + clouds
# Hills: a fractal skyline, textured ground below it.
sky_line = 330 + fractal(1, W, 3, 7, 60)[0]
ground = yy > sky_line[None, :]
tex = fractal(H, W, 16, 6, 30, 0.7)
img[ground] = np.stack([70 + tex, 105 + 0.8 * tex, 45 + 0.5 * tex], -1)[ground]
# Blocks with windows (edges at many positions and contrasts).
for i in range(14):
    x0 = rs.randint(0, W - 80); bw = rs.randint(40, 160)
    y0 = rs.randint(250, 520); bh = rs.randint(80, 260)
    col = rs.randint(60, 220, 3)
    img[y0:y0 + bh, x0:x0 + bw] = col
    for wy in range(y0 + 8, y0 + bh - 12, 18):
        for wx in range(x0 + 6, x0 + bw - 10, 14):
            if rs.rand() < 0.7:
                img[wy:wy + 9, wx:wx + 7] = rs.randint(20, 255, 3)
# Foliage: high-frequency texture in the lower third.
fol = fractal(H, W, 64, 4, 40, 0.8)
mask = (yy > 560) & (fol + octave_noise(H, W, 8, 40) > 5)
img[mask] = np.stack([40 + fol, 90 + fol, 30 + 0.5 * fol], -1)[mask]
img = np.clip(img, 0, 255)
# Text-like strokes: rows of short dark glyph shapes on light panels.
pic = Image.fromarray(img.astype(np.uint8))
d = ImageDraw.Draw(pic)
for p in range(4):
    px, py = 40 + p * 250, 620 + (p % 2) * 60
    d.rectangle([px, py, px + 210, py + 56], fill=(235, 232, 220))
    for line in range(3):
        x = px + 6
        while x < px + 200:
            word = rs.randint(2, 7)
            for _ in range(word):
                gx, gy = x, py + 5 + line * 17
                d.line([gx, gy + rs.randint(0, 4), gx + rs.randint(2, 6), gy + 11], fill=(20, 20, 30), width=1)
                d.line([gx, gy + 6, gx + 5, gy + 6 - rs.randint(-3, 4)], fill=(20, 20, 30), width=1)
                x += 7
            x += 6
arr = np.asarray(pic).astype(np.float64)
# Sensor noise and a vignette.
arr += rs.normal(0, 1.2, arr.shape)
r2 = ((xx - W / 2) / W) ** 2 + ((yy - H / 2) / H) ** 2
arr *= (1 - 0.5 * r2)[..., None]
pic = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8))
buf = io.BytesIO()
pic.save(buf, "JPEG", quality=90, subsampling="4:2:0")
data = buf.getvalue()
with open(os.path.join(HERE, "photo_1024x768.jpg"), "wb") as f:
    f.write(data)

# The reference: Pillow decode + torchvision's CLIP-336 transform.
import torch
from torchvision import transforms as T

torch.set_num_threads(1)
im = Image.open(io.BytesIO(data)).convert("RGB")
resized = T.Resize(336, interpolation=T.InterpolationMode.BICUBIC)(im)
crop = T.CenterCrop(336)(resized)
x = T.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))(T.ToTensor()(crop))
refs = {
    "bytes": len(data),
    "jpeg_sha256": hashlib.sha256(data).hexdigest(),
    "resized": list(resized.size),
    "crop_rgb_sha256": hashlib.sha256(np.asarray(crop, dtype=np.uint8).tobytes()).hexdigest(),
    "clip336_f32_sha256": hashlib.sha256(x.numpy().astype("<f4").tobytes()).hexdigest(),
    "clip336_channel_sums": [float(x[c].double().sum()) for c in range(3)],
}
with open(os.path.join(HERE, "photo_refs.json"), "w") as f:
    json.dump(refs, f, indent=1)
print(json.dumps(refs))
