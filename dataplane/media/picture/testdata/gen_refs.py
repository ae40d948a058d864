#!/usr/bin/env python3
"""Writes the Pillow reference hashes the picture tests compare with (refs.json), and the small
test pictures they decode. Run with Debian bookworm's python3-pil (Pillow 9.4, libjpeg-turbo
2.1.5) and python3-numpy:

    /usr/bin/python3 dataplane/media/picture/testdata/gen_refs.py

Every expected value is Pillow's own output (decode, convert("RGB"), ImageOps.exif_transpose,
Image.resize, Image.crop), hashed with sha256 over the packed RGB bytes; nothing here
re-implements what the tests check, except InternVL's dynamic_preprocess grid choice, copied in
spirit from InternVL's README (tile order and sizes are then Pillow's)."""
import hashlib, io, json, math, os, struct, warnings, zlib
import numpy as np
from PIL import Image, ImageOps

warnings.simplefilter("ignore")  # Pillow warns about palette transparency given as bytes
HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.environ.get("DATAPLANE_FIXTURES", os.path.join(HERE, "../../../../../shared/fixtures"))
refs = {}

def h(img):
    return hashlib.sha256(np.asarray(img.convert("RGB"), dtype=np.uint8).tobytes()).hexdigest()

def save(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)

# 1. The shared JPEG as Pillow decodes it.
refs["decode/image_200x150.jpg"] = h(Image.open(os.path.join(FIX, "image_200x150.jpg")))
refs["decode/image_200x150.png"] = h(Image.open(os.path.join(FIX, "image_200x150.png")))

# 2. A small asymmetric picture, saved with each EXIF orientation (JPEG and PNG eXIf).
rng = np.random.default_rng(20261122)
base = rng.integers(0, 256, (13, 21, 3), dtype=np.uint8)
base[:4, :6] = [255, 0, 0]  # a red corner shows which way is up
src = Image.fromarray(base)
for o in range(1, 9):
    exif = Image.Exif()
    exif[0x0112] = o
    buf = io.BytesIO()
    src.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    save(f"orient{o}.jpg", buf.getvalue())
    refs[f"orient/jpeg/{o}"] = h(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue()))))
    buf = io.BytesIO()
    src.save(buf, "PNG", exif=exif.tobytes())
    save(f"orient{o}.png", buf.getvalue())
    refs[f"orient/png/{o}"] = h(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue()))))

# 3. PNG pixel layouts, each as Pillow's convert("RGB") sees it.
rgba = rng.integers(0, 256, (9, 11, 4), dtype=np.uint8)
variants = {
    "gray": Image.fromarray(rgba[..., 0], "L"),
    "gray_alpha": Image.fromarray(rgba[..., :2].copy(), "LA"),
    "rgb": Image.fromarray(rgba[..., :3].copy(), "RGB"),
    "rgba": Image.fromarray(rgba, "RGBA"),
    "palette": Image.fromarray(rgba[..., :3].copy(), "RGB").quantize(37),
    "bilevel": Image.fromarray(rgba[..., 0] > 127),
}
pal_t = Image.fromarray(rgba[..., :3].copy(), "RGB").quantize(20)
pal_t.info["transparency"] = bytes(range(0, 240, 12))
variants["palette_trns"] = pal_t
for name, im in variants.items():
    buf = io.BytesIO()
    kw = {"transparency": im.info["transparency"]} if "transparency" in im.info else {}
    im.save(buf, "PNG", **kw)
    save(f"png_{name}.png", buf.getvalue())
    refs[f"png/{name}"] = h(Image.open(io.BytesIO(buf.getvalue())))
# 16-bit RGB and interlaced files, written by hand (Pillow writes neither from RGB).
def png_chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
def png16(arr16):
    hgt, wid, _ = arr16.shape
    raw = b"".join(b"\0" + arr16[y].astype(">u2").tobytes() for y in range(hgt))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", wid, hgt, 16, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))
a16 = rng.integers(0, 65536, (7, 5, 3), dtype=np.uint16)
save("png_rgb16.png", png16(a16))
refs["png/rgb16"] = h(Image.open(os.path.join(HERE, "png_rgb16.png")))
# A CMYK JPEG (valid, but not RGB: refused as unsupported).
Image.fromarray(rgba, "CMYK").save(os.path.join(HERE, "cmyk.jpg"), "JPEG")

# 4. Resizes of the shared PNG and of noise (which has the sharpest edges), BICUBIC and BILINEAR.
noise = Image.fromarray(rng.integers(0, 256, (57, 83, 3), dtype=np.uint8))
noise.save(os.path.join(HERE, "noise_83x57.png"))
photo = Image.open(os.path.join(FIX, "image_200x150.png")).convert("RGB")
for pname, pic in (("image_200x150", photo), ("noise_83x57", noise)):
    for size in [(64, 48), (300, 225), (85, 64), (37, 211), (1, 1), (200, 1), (451, 150), (83, 20), (7, 57), (2000, 3)]:
        for fname, flt in (("bicubic", Image.BICUBIC), ("bilinear", Image.BILINEAR)):
            refs[f"resize/{pname}/{size[0]}x{size[1]}/{fname}"] = h(pic.resize(size, flt))

# 5. InternVL tiles (grid choice as in InternVL's dynamic_preprocess; resize and crop by Pillow).
def closest(aspect, ratios, w, hh, s):
    best_diff, best = float("inf"), (1, 1)
    for r in ratios:
        diff = abs(aspect - r[0] / r[1])
        if diff < best_diff:
            best_diff, best = diff, r
        elif diff == best_diff and w * hh > 0.5 * s * s * r[0] * r[1]:
            best = r
    return best
def dynamic(img, lo=1, hi=12, s=448, thumb=True):
    w, hh = img.size
    ratios = sorted({(i, j) for n in range(lo, hi + 1) for i in range(1, n + 1) for j in range(1, n + 1) if lo <= i * j <= hi},
                    key=lambda x: x[0] * x[1])
    c, r = closest(w / hh, ratios, w, hh, s)
    big = img.resize((s * c, s * r))
    tiles = [big.crop(((i % c) * s, (i // c) * s, (i % c + 1) * s, (i // c + 1) * s)) for i in range(c * r)]
    if thumb and len(tiles) != 1:
        tiles.append(img.resize((s, s)))
    return (c, r), tiles
for size in [(200, 150), (1000, 300), (300, 1000), (448, 448), (2000, 2000), (50, 900)]:
    grid, tiles = dynamic(photo.resize(size, Image.BICUBIC))
    refs[f"internvl/{size[0]}x{size[1]}"] = {"grid": list(grid), "tiles": [h(t) for t in tiles]}

# 6. LLaVA-NeXT's anyres pictures, as transformers' LlavaNextImageProcessor (PIL backend,
# image_processing_pil_llava_next.py at f5956fde, and image_processing_utils.py's
# select_best_resolution / get_patch_output_size) makes them before normalising: the base
# picture squashed to 336 x 336, then the picture resized into the best grid resolution, padded
# with zeros (offsets divmod(difference, 2)), cut into 336-px tiles row by row.
def best_resolution(h, w, pins):
    best, max_eff, min_waste = None, 0, float("inf")
    for ph, pw in pins:
        scale = min(pw / w, ph / h)
        eff = min(int(w * scale) * int(h * scale), w * h)
        waste = ph * pw - eff
        if eff > max_eff or (eff == max_eff and waste < min_waste):
            best, max_eff, min_waste = (ph, pw), eff, waste
    return best
def anyres(img, pins=((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)), tile=336):
    w, hh = img.size
    bh, bw = best_resolution(hh, w, pins)
    sw, sh = bw / w, bh / hh
    if sw < sh:
        nh, nw = min(math.ceil(hh * sw), bh), bw
    else:
        nh, nw = bh, min(math.ceil(w * sh), bw)
    canvas = Image.new("RGB", (bw, bh))
    canvas.paste(img.resize((nw, nh), Image.BICUBIC), ((bw - nw) // 2, (bh - nh) // 2))
    tiles = [canvas.crop((x, y, x + tile, y + tile)) for y in range(0, bh, tile) for x in range(0, bw, tile)]
    return [img.resize((tile, tile), Image.BICUBIC)] + tiles
for size in [(200, 150), (1000, 300), (83, 900), (336, 336), (700, 1400), (1, 1), (55, 88)]:
    refs[f"llava-next/{size[0]}x{size[1]}"] = [h(t) for t in anyres(photo.resize(size, Image.BICUBIC))]

with open(os.path.join(HERE, "refs.json"), "w") as f:
    json.dump(refs, f, indent=1, sort_keys=True)
print(len(refs), "references")
