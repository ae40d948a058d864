#!/usr/bin/python3
"""An independent reference for what a vLLM engine does with the daemon's hand-off, written
from vLLM's source (files and commits: ../../NOTES.md and README.md here), in plain Python:
hashlib, Debian's python3-torch (torch.load and tensor_data as vLLM calls them),
python3-xxhash (the router's side), python3-zmq and python3-msgpack (KV events).

    /usr/bin/python3 vllm_ref.py vectors          writes vectors.json beside this file
    /usr/bin/python3 vllm_ref.py publish SPEC     a KV-event publisher for one request (below)

`publish` reads SPEC (JSON) describing what the daemon sent one engine, works out the blocks
that engine would cache and the BlockStored event it would publish, binds a ZMQ PUB socket on
127.0.0.1 (a free port), prints one JSON line {"pub": endpoint, "blocks": n, "tokens": n} and
publishes the batch as seq 0 every 50 ms until stdin closes (the router applies the first copy
it sees and ignores the repeats as duplicates, as it does vLLM's). SPEC:

  {"mode": "embeds", "block_size": 16, "cache_salt": "...",
   "prompt_embeds": "<base64 torch.save, exactly the request's prompt_embeds field>"}
  {"mode": "ec", "block_size": 16, "cache_salt": "...", "ec_dir": "<shared_storage_path>",
   "chat": {<the /v1/chat/completions body the engine got>},
   "token_ids": [<the chat rendered with one placeholder token per media part>],
   "placeholders": [<the placeholder token ids>]}

In "ec" mode the engine's tokenization is stood in for by token_ids (a real engine renders the
chat with the same template and tokenizer); each placeholder is expanded, as vLLM's processor
does, to the item's number of embeddings, read from the EC file the way the EC connector reads
it, from <ec_dir>/<uuid>/encoder_cache.safetensors (a missing or malformed file is an error).
"""
import base64
import hashlib
import io
import json
import os
import pickle
import struct
import sys
import threading
import time

M64 = (1 << 64) - 1


# ---- vLLM: prompt_embeds ----------------------------------------------------------------

def load_prompt_embeds(b64):
    """vllm/renderers/embed_utils.py safe_load_prompt_embeds: no dtype cast."""
    import torch
    t = torch.load(io.BytesIO(base64.b64decode(b64, validate=True)), weights_only=True,
                   map_location=torch.device("cpu"))
    assert isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.bfloat16, torch.float16), t.dtype
    t = t.to_dense()
    if t.dim() > 2:
        t = t.squeeze(0)
    assert t.dim() == 2
    return t


def tensor_data(t):
    """vllm/v1/utils.py tensor_data: the raw element bytes, flattened and contiguous."""
    import torch
    return t.flatten().contiguous().view(torch.uint8).numpy().tobytes()


def embeds_digest(t, start, end):
    """kv_cache_utils.py _gen_prompt_embeds_extra_hash_keys for block [start, end)."""
    return hashlib.sha256(tensor_data(t[start:end])).digest()


# ---- vLLM: multimodal extra keys and the EC connector's files ------------------------------

def mm_extra_keys(features, start, end):
    """kv_cache_utils.py _gen_mm_extra_hash_keys: (identifier, offset in block) for every item
    (features sorted by offset; each (identifier, offset, length)) the block overlaps."""
    keys = []
    for ident, offset, length in features:
        if end > offset and start < offset + length:
            keys.append((ident, offset - start))
    return keys


def block_extra_keys(start, end, features, salt, embeds):
    """generate_block_hash_extra_keys: LoRA (none) + mm + cache_salt (first block) + embeds."""
    keys = mm_extra_keys(features, start, end)
    if start == 0 and salt:
        keys.append(salt)
    if embeds is not None:
        keys.append(embeds_digest(embeds, start, end))
    return tuple(keys) if keys else None


def mm_identifier(uuid, mm_processor_kwargs=None, tokenization_kwargs=None, tower_lora=None):
    """processing/processor.py _hash_mm_items with a uuid, then input_processor.py
    _get_mm_identifier. None: vLLM would hash the uuid with the kwargs instead (not a file
    name anyone else can compute)."""
    if mm_processor_kwargs or tokenization_kwargs:
        return None
    if tower_lora:
        return tower_lora + ":" + uuid
    return uuid


def ec_file(storage_path, identifier):
    """example_connector.py _generate_filename_debug."""
    return os.path.join(storage_path, identifier, "encoder_cache.safetensors")


def read_ec_cache(path):
    """safetensors.torch.load_file(path)["ec_cache"], by the format: u64 LE header length,
    JSON header, data. Returns (dtype, shape)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    t = hdr["ec_cache"]
    begin, end = t["data_offsets"]
    size = {"F32": 4, "F16": 2, "BF16": 2}[t["dtype"]]
    count = 1
    for d in t["shape"]:
        count *= d
    assert len(t["shape"]) == 2 and end - begin == count * size and 8 + n + end <= len(raw), (path, t)
    return t["dtype"], t["shape"]


# ---- the daemon's identifier (ours, not vLLM's) -------------------------------------------

def ec_name(salt, content, model, preprocess):
    """transfer.ECName: hex SHA-256 of the key's fields, each as LE u32 length + bytes."""
    h = hashlib.sha256()
    for f in (salt, content, model, preprocess):
        b = f.encode()
        h.update(struct.pack("<I", len(b)) + b)
    return h.hexdigest()


# ---- the router's side (router/hash.go), for the vectors ----------------------------------

def router_seed(salt):
    import xxhash
    seed = 1337
    if salt:
        seed = (seed + xxhash.xxh3_64_intdigest(salt.encode(), seed=1)) & M64
    return seed


def embeds_digest_hash(digest):
    """router.EmbedsDigestHash: XXH3-64 of the 32-byte digest, seed 0."""
    import xxhash
    return xxhash.xxh3_64_intdigest(digest, seed=0)


def router_sequence(tokens, block_media, seed, bs):
    """Sequence hashes of the full blocks; block_media[i] lists block i's media hashes."""
    import xxhash
    out = []
    for i in range(len(tokens) // bs):
        b = b"".join(struct.pack("<I", t) for t in tokens[i * bs:(i + 1) * bs])
        b += b"".join(struct.pack("<Q", h) for h in sorted(block_media[i]))
        local = xxhash.xxh3_64_intdigest(b, seed=seed)
        out.append(local if i == 0 else xxhash.xxh3_64_intdigest(struct.pack("<QQ", out[-1], local), seed=1337))
    return out


# ---- vectors ----------------------------------------------------------------------------------

def vectors():
    import torch
    rows, cols, bs = 40, 24, 16
    # Values exact in bf16 and f16: quarters in [-7.5, 7.5].
    base = torch.tensor([((i * 7) % 61 - 30) * 0.25 for i in range(rows * cols)], dtype=torch.float32).reshape(rows, cols)
    embeds = []
    for name, dt in (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)):
        t = base.to(dt)
        digests = [embeds_digest(t, b * bs, (b + 1) * bs) for b in range(rows // bs)]
        seqs = {}
        for salt in ("", "tenant-a"):
            media = [[embeds_digest_hash(d)] for d in digests]
            seqs[salt] = [str(h) for h in router_sequence([0] * rows, media, router_seed(salt), bs)]
        embeds.append({"dtype": name, "digests": [d.hex() for d in digests], "router_sequence": seqs})
    names = []
    for salt, content, model, pre in (
            ("", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "clip-vit-l-14/cpu", "clip-336/default"),
            ("tenant-a", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "clip-vit-l-14/cpu", "clip-336/default"),
            ("tenant-a", "img-1", "whisper/cpu", "whisper-80/max-frames=8"),
            ("s\x00alt", "", "m", "")):
        n = ec_name(salt, content, model, pre)
        names.append({"salt": salt, "content": content, "model": model, "preprocess": pre, "name": n,
                      "identifier": mm_identifier(n), "file": ec_file("/ec", mm_identifier(n))})
    out = {
        "about": "vllm_ref.py vectors: see README.md",
        "embeds": {"rows": rows, "cols": cols, "block_size": bs,
                   "values": "((i*7) % 61 - 30) * 0.25 for i in range(rows*cols), row-major, then cast",
                   "cases": embeds},
        "ec_names": names,
        "identifier_not_uuid": {"with_mm_processor_kwargs": mm_identifier("u", {"fps": 2}),
                                "with_tower_lora": mm_identifier("u", tower_lora="adapter")},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", path)


# ---- publisher ------------------------------------------------------------------------------

def engine_hash(parent, tokens, extra):
    """Stands in for vLLM's sha256-CBOR block hash (no cbor2 on Debian here): the router treats
    engine hashes as opaque names, linked by parent_block_hash."""
    return hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra))).digest()


def block_stored(tokens, features, salt, embeds, bs):
    """The BlockStored vLLM's BlockPool.cache_full_blocks publishes for a new request's full
    blocks, as msgspec's array_like tagged array."""
    hashes, extras, parent = [], [], None
    full = len(tokens) // bs
    for b in range(full):
        s, e = b * bs, (b + 1) * bs
        extra = block_extra_keys(s, e, features, salt, embeds)
        h = engine_hash(parent, tokens[s:e], extra)
        hashes.append(h)
        extras.append(list(extra) if extra is not None else None)
        parent = h
    ev = ["BlockStored", hashes, None, tokens[:full * bs], bs, None, "GPU", None,
          extras if any(x is not None for x in extras) else None]
    return ev, full


def ec_request(spec):
    placeholders = set(spec["placeholders"])
    uuids = []
    for msg in spec["chat"]["messages"]:
        content = msg.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") in ("image_url", "input_audio", "audio_url", "video_url"):
                    uuids.append(part["uuid"])
    tokens, features, k = [], [], 0
    for t in spec["token_ids"]:
        if t not in placeholders:
            tokens.append(t)
            continue
        ident = mm_identifier(uuids[k])
        _, shape = read_ec_cache(ec_file(spec["ec_dir"], ident))
        features.append((ident, len(tokens), shape[0]))
        tokens.extend([t] * shape[0])
        k += 1
    assert k == len(uuids), f"{k} placeholders for {len(uuids)} media parts"
    return tokens, features


def publish(spec_path):
    import msgpack
    import zmq
    with open(spec_path) as f:
        spec = json.load(f)
    bs, salt = spec["block_size"], spec.get("cache_salt") or None
    if spec["mode"] == "embeds":
        embeds = load_prompt_embeds(spec["prompt_embeds"])
        tokens, features = [0] * embeds.shape[0], []
    else:
        embeds = None
        tokens, features = ec_request(spec)
    ev, full = block_stored(tokens, features, salt, embeds, bs)
    payload = msgpack.packb([time.time(), [ev], 0], use_bin_type=True)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"pub": f"tcp://127.0.0.1:{port}", "blocks": full, "tokens": len(tokens)}), flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.wait(0.05):
        pub.send_multipart([b"", struct.pack(">Q", 0), payload])
    pub.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "vectors":
        vectors()
    elif len(sys.argv) == 3 and sys.argv[1] == "publish":
        publish(sys.argv[2])
    else:
        sys.exit(__doc__)
