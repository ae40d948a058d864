#!/usr/bin/python3
"""Writes the router's and kvevents' test vectors from independent implementations.

XXH3-64 comes from Debian's python3-xxhash (the reference C library), msgpack from Debian's
python3-msgpack. Run once after changing it: `/usr/bin/python3 gen_vectors.py` in this folder;
`make test` only reads the JSON it writes, so no Python is needed to test.

Outputs:
  xxh3_vectors.json   XXH3-64 of deterministic byte strings (lengths 0..300 and a few long ones)
                      under several seeds.
  block_vectors.json  Dynamo-style block hashes (see ../hash.go) computed here from the spec:
                      seed = 1337 (+ xxh3(lora, 0)) (+ xxh3(salt, 1)), local = xxh3(tokens as LE u32
                      || sorted media hashes of items overlapping the block as LE u64, seed),
                      seq[0] = local[0], seq[i] = xxh3(LE(seq[i-1]) || LE(local[i]), 1337).
  ../kvevents/testdata/vllm_batches.json
                      vLLM KV-event batches encoded as msgspec would (array_like tagged arrays, and
                      the newer maps with "type"), with the values a decoder must read back.
                      (Written from here: it draws from the same random stream, after the block
                      vectors.)
"""
import json
import random
import struct

import msgpack
import xxhash

M64 = (1 << 64) - 1


def xxh3(data, seed=0):
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def det_bytes(n):
    # Bytes a Go test can regenerate: b[i] = (i*131 + 7) & 0xff.
    return bytes(((i * 131 + 7) & 0xFF) for i in range(n))


def xxh3_vectors():
    seeds = [0, 1, 1337, M64, 0x9E3779B97F4A7C15]
    lengths = list(range(0, 301)) + [511, 512, 1024, 2048, 4096, 10000]
    out = []
    for seed in seeds:
        for n in lengths:
            out.append({"len": n, "seed": str(seed), "hash": str(xxh3(det_bytes(n), seed))})
    return out


def seed_for(lora, salt):
    seed = 1337
    if lora:
        seed = (seed + xxh3(lora.encode(), 0)) & M64
    if salt:
        seed = (seed + xxh3(salt.encode(), 1)) & M64
    return seed


def block_hashes(tokens, block_size, lora, salt, media):
    seed = seed_for(lora, salt)
    local, seq = [], []
    for b in range(len(tokens) // block_size):
        start, end = b * block_size, (b + 1) * block_size
        data = b"".join(struct.pack("<I", t) for t in tokens[start:end])
        hs = sorted(m["hash"] for m in media if m["offset"] < end and m["offset"] + m["length"] > start)
        data += b"".join(struct.pack("<Q", h) for h in hs)
        h = xxh3(data, seed)
        local.append(h)
        if b == 0:
            seq.append(h)
        else:
            seq.append(xxh3(struct.pack("<QQ", seq[-1], h), 1337))
    return local, seq


def block_vectors(rng):
    cases = []
    specs = [
        (16, 0, None, None, 0),
        (16, 15, None, None, 0),
        (16, 16, None, None, 0),
        (16, 100, None, None, 0),
        (16, 4096, None, None, 0),
        (64, 300, None, None, 0),
        (16, 64, "my-lora", None, 0),
        (16, 64, None, "tenant-a", 0),
        (16, 64, "my-lora", "tenant-a", 0),
        (16, 200, None, None, 2),
        (16, 200, "adapter", "salt", 3),
        (32, 256, None, None, 5),
        (1, 9, None, None, 1),
    ]
    for bs, n, lora, salt, nmedia in specs:
        tokens = [rng.randrange(0, 1 << 32) for _ in range(n)]
        media = []
        for _ in range(nmedia):
            off = rng.randrange(0, max(1, n))
            media.append({"hash": str(rng.randrange(0, 1 << 64)), "offset": off,
                          "length": rng.randrange(1, 80)})
        local, seq = block_hashes(tokens, bs, lora, salt,
                                  [dict(m, hash=int(m["hash"])) for m in media])
        cases.append({
            "block_size": bs, "tokens": tokens, "lora": lora or "", "salt": salt or "",
            "media": media, "local": [str(h) for h in local], "seq": [str(h) for h in seq],
        })
    return cases


def vllm_batches(rng):
    """Each case: the payload as hex and what it must decode to."""
    cases = []
    toks = [rng.randrange(0, 150000) for _ in range(32)]
    big = 15760518052499183552  # > 2^63: msgpack uint64
    neg = -1234567890123        # negative int64 hash (the low 64 bits as two's complement)
    digest = bytes(rng.randrange(256) for _ in range(32))

    # Old encoding (msgspec array_like=True, tag first), batch [ts, events] without dp rank.
    old = [1789095808.84, [
        ["BlockStored", [big, neg], None, toks, 16, None],
        ["BlockRemoved", [big]],
        ["AllBlocksCleared"],
    ]]
    cases.append({"name": "array-v0.9", "payload": msgpack.packb(old).hex(), "want": {
        "ts": 1789095808.84, "dp_rank": None, "events": [
            {"type": "BlockStored", "hashes": [str(big), str(neg & M64)], "parent": None,
             "tokens": toks, "block_size": 16, "medium": "", "lora_name": "", "group": None},
            {"type": "BlockRemoved", "hashes": [str(big)], "medium": "", "group": None},
            {"type": "AllBlocksCleared"},
        ]}})

    # Array encoding with every field (newer field order), dp rank present, bytes hashes.
    full = [1.5, [
        ["BlockStored", [digest, digest[-8:]], digest, toks[:16], 16, 3, "GPU", "lora-x",
         [[["abcd", 0]]], 1, "full_attention", None],
        ["BlockRemoved", [digest], "CPU", 1],
    ], 2]
    last8 = str(int.from_bytes(digest[-8:], "big"))
    cases.append({"name": "array-full", "payload": msgpack.packb(full).hex(), "want": {
        "ts": 1.5, "dp_rank": 2, "events": [
            {"type": "BlockStored", "hashes": [last8, last8], "parent": last8,
             "tokens": toks[:16], "block_size": 16, "medium": "GPU", "lora_name": "lora-x",
             "group": 1, "kind": "full_attention"},
            {"type": "BlockRemoved", "hashes": [last8], "medium": "CPU", "group": 1},
        ]}})

    # Map encoding (msgspec default Struct with tag=True: "type" key), as in the v0.26 sample,
    # with an unknown field that must be ignored and dp rank omitted (omit_defaults).
    m = {"ts": 1789095808.84, "events": [
        {"type": "BlockStored", "block_hashes": [big], "parent_block_hash": None,
         "token_ids": toks[:16], "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "extra_keys": [None], "group_idx": 0,
         "kv_cache_spec_kind": "full_attention", "future_field": {"x": [1, 2]}},
        {"type": "BlockRemoved", "block_hashes": [big, 7], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]}
    cases.append({"name": "map-v0.26", "payload": msgpack.packb(m).hex(), "want": {
        "ts": 1789095808.84, "dp_rank": None, "events": [
            {"type": "BlockStored", "hashes": [str(big)], "parent": None, "tokens": toks[:16],
             "block_size": 16, "medium": "GPU", "lora_name": "", "group": 0,
             "kind": "full_attention"},
            {"type": "BlockRemoved", "hashes": [str(big), "7"], "medium": "GPU", "group": None},
            {"type": "AllBlocksCleared"},
        ]}})
    m2 = dict(m, data_parallel_rank=5)
    cases.append({"name": "map-dp", "payload": msgpack.packb(m2).hex(), "want": dict(
        cases[-1]["want"], dp_rank=5)})
    return cases


def main():
    rng = random.Random(20261122)
    with open("xxh3_vectors.json", "w") as f:
        json.dump(xxh3_vectors(), f, indent=0)
    with open("block_vectors.json", "w") as f:
        json.dump(block_vectors(rng), f, indent=0)
    with open("../kvevents/testdata/vllm_batches.json", "w") as f:
        json.dump(vllm_batches(rng), f, indent=1)


if __name__ == "__main__":
    main()
