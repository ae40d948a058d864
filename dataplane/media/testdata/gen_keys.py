#!/usr/bin/env python3
"""Prints the content keys media_test.go expects, computed independently of our code: pixels
decoded by Pillow, samples read with numpy, the header packed with struct, hashed by the b3sum
command (Debian packages python3-pil, python3-numpy, b3sum)."""
import os, struct, subprocess, tempfile
import numpy as np
from PIL import Image

FIX = os.environ.get("DATAPLANE_FIXTURES", os.path.join(os.path.dirname(__file__), "../../../../shared/fixtures"))

def b3(blob):
    with tempfile.NamedTemporaryFile() as f:
        f.write(blob)
        f.flush()
        return subprocess.check_output(["b3sum", "--no-names", f.name]).decode().strip()

for name in ["image_200x150.png", "image_200x150.jpg"]:
    a = np.asarray(Image.open(os.path.join(FIX, name)).convert("RGB"), dtype=np.uint8)
    h, w, _ = a.shape
    print(name, b3(struct.pack("<BBBBII", 1, 0, 0, 3, h, w) + a.tobytes()))
pcm = np.fromfile(os.path.join(FIX, "audio_7s3.wav"), dtype="<i2", offset=44)
s = pcm.astype(np.float32) / np.float32(32768)
print("audio_7s3.wav", b3(struct.pack("<BBBBII", 1, 1, 2, 1, 16000, len(s)) + s.astype("<f4").tobytes()))
