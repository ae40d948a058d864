#!/usr/bin/env python3
"""Peer for JPEG -> CLIP-336 tensor: what openai/CLIP's _transform does (Pillow open +
convert("RGB"), torchvision Resize(336, BICUBIC) + CenterCrop(336) + ToTensor + Normalize with
CLIP's mean/std), from the JPEG bytes in memory, on one thread. Source: openai/CLIP
clip/clip.py `_transform` at 3bee28119e6b28e75b82b811b87b56935314e6a5 (it converts to RGB after
the crop; for an RGB JPEG the order changes nothing).

    /usr/bin/python3 bench/peers/clip_preprocess.py --iters 200 [--image PATH]

Prints one JSON line on stdout ({"peer", "case", "ms_per_item", "cpu_ms_per_item" (user + system
CPU time of the process: steadier on a shared machine), versions}); logs on stderr. The
default image is the photo the Go benchmark uses (dataplane/media/picture/testdata)."""
import argparse, io, json, os, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--image", default=os.path.join(ROOT, "dataplane/media/picture/testdata/photo_1024x768.jpg"))
    ap.add_argument("--case", default="photo-1024x768-q90")
    a = ap.parse_args()
    # One thread means one for OpenBLAS and OpenMP too (torch.set_num_threads does not reach
    # OpenBLAS's own pool); set before torch loads them.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import PIL
    from PIL import Image
    import torch, torchvision
    from torchvision import transforms as T

    torch.set_num_threads(a.threads)
    data = open(a.image, "rb").read()
    tf = T.Compose([
        T.Resize(336, interpolation=T.InterpolationMode.BICUBIC),
        T.CenterCrop(336),
        T.ToTensor(),
        T.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    ])

    def one():
        return tf(Image.open(io.BytesIO(data)).convert("RGB"))

    for _ in range(max(3, a.iters // 10)):  # warm-up
        one()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.iters):
        x = one()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert tuple(x.shape) == (3, 336, 336)
    print(f"clip_preprocess: {a.iters} iters, {dt / a.iters * 1e3:.3f} ms/item", file=sys.stderr)
    print(json.dumps({
        "peer": "pillow+torchvision", "case": a.case, "ms_per_item": dt / a.iters * 1e3,
        "cpu_ms_per_item": cpu / a.iters * 1e3, "iters": a.iters,
        "threads": a.threads, "image_bytes": len(data), "pillow": PIL.__version__, "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }))


if __name__ == "__main__":
    main()
