#!/usr/bin/env python3
"""Independent reference for `dataplane plan replay`: Dynamo's load-based planner rules
(ai-dynamo/dynamo examples/llm/components/planner.py at e3f4bfef70d4dcfd5a761e1029c23e10f21ef6a9,
Planner.make_adjustments), run over a synthetic load ramp with changes completing at once.

Written from the upstream source, not from our Go code. Where issue 25 says more than Dynamo:
- the decode grace period blocks the 3 intervals after the one that added a worker (Dynamo sets
  the counter to 3 and decrements it at the end of the same call, which leaves 2);
- --min-gpu-budget: no scale-down that leaves fewer GPUs;
- an interval with no samples holds (numpy's mean of nothing is nan: every comparison false).

Run: python3 reference.py  (writes ramp.jsonl and ramp.expected.jsonl beside it)
"""
import json
import math
import os
import random

ADJ, PULL = 30.0, 1.0
KV_UP, KV_DOWN, Q_UP, Q_DOWN = 0.9, 0.5, 0.5, 0.2
MAX_GPU, MIN_GPU, P_GPU, D_GPU, MIN_ENDPOINT = 8, 2, 1, 1, 1
GRACE, BUFFER = 3, 3


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def adjust(p, d, queue, kv, grace):
    gpu = p * P_GPU + d * D_GPU
    aq, akv = mean(queue), mean(kv)
    dp = dd = 0
    if aq < Q_DOWN and p > MIN_ENDPOINT and gpu - P_GPU >= MIN_GPU:
        dp, gpu = -1, gpu - P_GPU
    if akv < KV_DOWN and d > MIN_ENDPOINT and grace == 0 and gpu - D_GPU >= MIN_GPU:
        dd, gpu = -1, gpu - D_GPU
    if aq > Q_UP and gpu + P_GPU <= MAX_GPU:
        predicted = queue[-1] + (queue[-1] - queue[0]) * BUFFER
        if predicted > Q_UP:
            dp, gpu = 1, gpu + P_GPU
    if akv > KV_UP and gpu + D_GPU <= MAX_GPU:
        dd, gpu = 1, gpu + D_GPU
    if dd == 1:
        grace = GRACE
    elif grace > 0:
        grace -= 1
    return dp, dd, aq, akv, grace


def action(dp, dd):
    parts = []
    if dp:
        parts.append("prefill%+d" % dp)
    if dd:
        parts.append("decode%+d" % dd)
    return ",".join(parts) or "hold"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(25)
    # Offered load ramps from 0.5 to 6 "units" over 10 minutes and back down over 10 minutes;
    # each prefill worker absorbs 1 unit of queue, each decode worker 1.5 units of KV.
    p, d, grace = 1, 1, 0
    obs, out = [], []
    queue, kv = [], []
    end = ADJ
    total = 1200
    for i in range(total):
        t = i * PULL
        if t >= end:
            dp, dd, aq, akv, grace = adjust(p, d, queue, kv, grace)
            p, d = p + dp, d + dd
            out.append({"t": end, "prefill": p, "decode": d, "action": action(dp, dd), "samples": len(queue),
                        "avg_prefill_queue": None if math.isnan(aq) else round(aq, 9),
                        "avg_decode_kv": None if math.isnan(akv) else round(akv, 9)})
            queue, kv = [], []
            end += ADJ
        load = 0.5 + 5.5 * (i / 600 if i < 600 else (total - i) / 600)
        q = max(0.0, (load - p) / p + rng.uniform(-0.05, 0.05))
        k = min(1.0, max(0.0, load / (1.5 * d) + rng.uniform(-0.03, 0.03)))
        q, k = round(q, 4), round(k, 4)
        obs.append({"t": t, "prefill_queue": q, "decode_kv": k})
        queue.append(q)
        kv.append(k)
    if queue and (total - 1) * PULL >= end - PULL:
        dp, dd, aq, akv, grace = adjust(p, d, queue, kv, grace)
        p, d = p + dp, d + dd
        out.append({"t": end, "prefill": p, "decode": d, "action": action(dp, dd), "samples": len(queue),
                    "avg_prefill_queue": round(aq, 9), "avg_decode_kv": round(akv, 9)})
    with open(os.path.join(here, "ramp.jsonl"), "w") as f:
        for o in obs:
            f.write(json.dumps(o) + "\n")
    with open(os.path.join(here, "ramp.expected.jsonl"), "w") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")


if __name__ == "__main__":
    main()
