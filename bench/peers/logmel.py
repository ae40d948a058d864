#!/usr/bin/env python3
"""Peer for the Whisper log-mel spectrogram of 30 s: openai/whisper's log_mel_spectrogram
(whisper/audio.py at 06dc24a5ad0895bc28a6e5f39f776045b3705784) as it computes it, with torch on
one thread:

    stft = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_spec = filters @ magnitudes                 # librosa's Slaney filters, [80, 201]
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    log_spec = (log_spec + 4.0) / 4.0

Input: the signal native's BenchmarkLogMel30s uses (480,000 samples of two tones and a chirp, no
padding: 3000 frames), or --wav. The filters are ../shared/fixtures/mel_filters.npz (whisper's
own asset) when present. Run with OpenBLAS for torch's matmul, without touching the machine's
BLAS alternatives:

    LD_LIBRARY_PATH=build/openblas/usr/lib/x86_64-linux-gnu/openblas-pthread /usr/bin/python3 bench/peers/logmel.py --iters 200

Prints one JSON line on stdout ({"peer", "case", "ms_per_item", "cpu_ms_per_item" (user + system
CPU time of the process: steadier on a shared machine), versions, "blas": the BLAS
library mapped into this process}); logs on stderr. --out writes the spectrogram (float32, [80,
3000]) for an accuracy check against ours."""
import argparse, json, math, os, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def loaded_blas():
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if any(k in p for k in ("blas", "mkl", "lapack")):
                libs.add(os.path.realpath(p))
    return sorted(libs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mels", type=int, default=80)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    # One thread means one for OpenBLAS and OpenMP too (torch.set_num_threads does not reach
    # OpenBLAS's own pool); set before torch loads them.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    n = 480000
    i = np.arange(n, dtype=np.float64)
    t = i / 16000
    x = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 3150 * t + 1.1) + 0.01 * np.sin(i * 1e-3 * i)).astype(np.float32)
    audio = torch.from_numpy(x)
    fx = os.path.join(ROOT, "../shared/fixtures/mel_filters.npz")
    if not os.path.exists(fx):
        sys.exit(f"logmel: {fx} missing (whisper's mel_filters.npz)")
    filters = torch.from_numpy(np.load(fx)[f"mel_{a.mels}"])
    window = torch.hann_window(400)

    def one():
        stft = torch.stft(audio, 400, 160, window=window, return_complex=True)
        magnitudes = stft[..., :-1].abs() ** 2
        mel_spec = filters @ magnitudes
        log_spec = torch.clamp(mel_spec, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0

    for _ in range(max(3, a.iters // 10)):
        one()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.iters):
        y = one()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert tuple(y.shape) == (a.mels, 3000), y.shape
    if a.out:
        y.numpy().astype("<f4").tofile(a.out)
    print(f"logmel: {a.iters} iters, {dt / a.iters * 1e3:.3f} ms/item", file=sys.stderr)
    print(json.dumps({
        "peer": "torch.stft", "case": f"logmel-30s-{a.mels}", "ms_per_item": dt / a.iters * 1e3,
        "cpu_ms_per_item": cpu / a.iters * 1e3, "iters": a.iters,
        "threads": a.threads, "torch": torch.__version__, "numpy": np.__version__, "blas": loaded_blas(),
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
    }))


if __name__ == "__main__":
    main()
