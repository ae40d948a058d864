"""Shared set-up for the PyTorch encoder peers (vit_b16.py, whisper_base_encoder.py).

OpenBLAS is loaded through the library path, never by switching the machine's BLAS
alternatives: when LD_LIBRARY_PATH does not name the openblas-pthread directory yet, the script
re-executes itself with it (the dynamic loader reads the variable only at process start), with
OPENBLAS_NUM_THREADS set to the thread count and, on a CPU with AVX-512 F, OPENBLAS_CORETYPE
SkylakeX: OpenBLAS 0.3.21 does not know Zen 5 and would pick its AVX2 Haswell kernels (as an
inherited OPENBLAS_CORETYPE=Haswell would), about half as fast here; the peer gets its best.
Logs go to stderr; stdout gets one JSON line.
"""
import argparse
import json
import os
import sys
import time

# make deps-peers unpacks Debian's libopenblas0-pthread under build/ (installing it would switch
# the machine's BLAS alternatives); DATAPLANE_OPENBLAS_DIR overrides the place.
OPENBLAS_DIR = os.environ.get("DATAPLANE_OPENBLAS_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "openblas", "usr", "lib", "x86_64-linux-gnu", "openblas-pthread")


def args(batch):
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=batch)
    a = p.parse_args()
    want = {"OPENBLAS_NUM_THREADS": str(a.threads), "OMP_NUM_THREADS": str(a.threads)}
    paths = [x for x in os.environ.get("LD_LIBRARY_PATH", "").split(":") if x]
    if os.path.isdir(OPENBLAS_DIR) and OPENBLAS_DIR not in paths:
        want["LD_LIBRARY_PATH"] = ":".join([OPENBLAS_DIR] + paths)
    if " avx512f " in open("/proc/cpuinfo").read().replace("\n", " "):
        want["OPENBLAS_CORETYPE"] = "SkylakeX"
    if any(os.environ.get(k) != v for k, v in want.items()):
        os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **want})
    return a


def blas():
    """The BLAS library this process has mapped, with OpenBLAS's core name when it is one."""
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l.lower() and "/" in l})
    name = ",".join(os.path.basename(x) for x in libs) or "none"
    try:
        import ctypes
        ob = next(x for x in libs if "openblas" in x)
        lib = ctypes.CDLL(ob)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        name += " core=" + lib.openblas_get_corename().decode()
    except Exception:  # not OpenBLAS, or an older one without the call
        pass
    return libs, name


def run(case, model, inputs, batch, a):
    import torch

    torch.set_num_threads(a.threads)
    libs, name = blas()
    print(f"{case}: torch {torch.__version__}, blas {name}, {a.threads} threads", file=sys.stderr)
    if not any("openblas" in x for x in libs):
        print("warning: OpenBLAS is not loaded", file=sys.stderr)
    with torch.inference_mode():
        model(inputs)  # warm-up
        times, cpu = [], 0.0
        for _ in range(a.iters):
            t0, c0 = time.perf_counter(), time.process_time()
            model(inputs)
            times.append(time.perf_counter() - t0)
            cpu += time.process_time() - c0
    times.sort()
    ms = times[len(times) // 2] * 1e3 / batch  # the median iteration
    print(f"{case}: per-iteration ms {[round(t * 1e3, 1) for t in times]}", file=sys.stderr)
    print(json.dumps({"peer": "pytorch", "case": case, "ms_per_item": round(ms, 3), "threads": a.threads,
                      "torch": torch.__version__, "blas": name, "iters": a.iters, "batch": batch,
                      # CPU time of all threads per item (spin-waiting BLAS/OpenMP threads count too)
                      "cpu_ms_per_item": round(cpu * 1e3 / (a.iters * batch), 3)}))
