#!/usr/bin/python3
"""Writes vllm_events.json: KV-event batches shaped as vLLM publishes them for hybrid models
(full attention beside sliding-window groups), MLA models (DeepSeek), and stores that carry
skipped context, with what each batch holds and what a router following them must conclude.

Written from vLLM's source (README.md in this folder names the files and commits), not from
our Go code: the events are built the way vLLM's BlockPool.cache_full_blocks,
emit_cached_block_events and cache_partial_block build them, and encoded the way msgspec
encodes vLLM's structs (kv_events.py): tagged structs with omit_defaults, either array_like
(older vLLM: [tag, fields in declaration order], trailing default fields dropped) or as maps
(vLLM since group_idx: {"type": tag, fields}, every field at its default dropped). msgpack
comes from Debian's python3-msgpack. Run `/usr/bin/python3 gen_vllm_events.py` in this folder;
the Go tests only read the JSON.

Block hashes: vLLM hashes (parent, token ids, extra keys) with SHA-256 over a serialisation
the router cannot reproduce (and need not: it rehashes tokens its own way). Here they are
SHA-256 over msgpack of the same triple, so they are 32-byte digests of the same shape, and
chain the same way; the int form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) is their last 8 bytes.
"""
import hashlib
import json
import random

import msgpack

BS = 16  # --block-size; the router's too
REQUIRED = object()  # a field without a default: always encoded

# Field declarations in vllm/distributed/kv_events.py: (name, default).
BLOCK_STORED = [
    ("block_hashes", REQUIRED), ("parent_block_hash", REQUIRED), ("token_ids", REQUIRED),
    ("block_size", REQUIRED), ("lora_id", REQUIRED), ("medium", REQUIRED), ("lora_name", REQUIRED),
    ("extra_keys", None), ("group_idx", None), ("kv_cache_spec_kind", None),
    ("kv_cache_spec_sliding_window", None),
    # vLLM PR #44488 (open): the map layout names them, so their position does not matter.
    ("skipped_parent_block_hash", None), ("skipped_token_ids", None), ("skipped_extra_keys", None),
]
BLOCK_REMOVED = [("block_hashes", REQUIRED), ("medium", REQUIRED), ("group_idx", None)]
ALL_CLEARED = []
EVENT_BATCH = [("ts", REQUIRED), ("events", REQUIRED), ("data_parallel_rank", None)]


def encode_struct(fields, values, array_like, tag=None):
    """msgspec's encoding of a Struct (omit_defaults=True; tag=True puts the class name first)."""
    if array_like:
        out = [values.get(name, default) for name, default in fields]
        while out and fields[len(out) - 1][1] is not REQUIRED and out[-1] == fields[len(out) - 1][1]:
            out.pop()  # array_like: only trailing defaults can be left out
        return ([tag] if tag else []) + out
    out = {"type": tag} if tag else {}
    for name, default in fields:
        v = values.get(name, default)
        if default is REQUIRED or v != default:
            out[name] = v
    return out


class Event:
    def __init__(self, kind, **values):
        self.kind, self.values = kind, values

    def encode(self, array_like):
        fields = {"BlockStored": BLOCK_STORED, "BlockRemoved": BLOCK_REMOVED,
                  "AllBlocksCleared": ALL_CLEARED}[self.kind]
        return encode_struct(fields, self.values, array_like, self.kind)


def batch(events, array_like, dp_rank=0, ts=1789095808.25):
    b = {"ts": ts, "events": [e.encode(array_like) for e in events], "data_parallel_rank": dp_rank}
    return msgpack.packb(encode_struct(EVENT_BATCH, b, array_like))


class Request:
    """A prompt as vLLM's Request sees it: tokens, LoRA, cache salt, multimodal placeholders."""

    def __init__(self, tokens, lora=None, salt=None, mm=(), int_hashes=False):
        self.tokens, self.lora, self.salt, self.mm = tokens, lora, salt, list(mm)
        self.int_hashes = int_hashes
        self.hashes = []  # one per full block, chained (Request.block_hashes)
        parent = b"NONE_HASH"
        for i in range(len(tokens) // BS):
            h = hashlib.sha256(msgpack.packb([parent, tokens[i * BS:(i + 1) * BS],
                                              self.extra_keys(i)])).digest()
            self.hashes.append(h)
            parent = h

    def extra_keys(self, i):
        """generate_block_hash_extra_keys: LoRA name, (identifier, offset in block) per item
        overlapping the block, the cache salt on the first block; None when there are none."""
        start, end = i * BS, (i + 1) * BS
        keys = [self.lora] if self.lora else []
        for ident, off, length in self.mm:
            if off < end and off + length > start:
                keys.append((ident, off - start))
        if start == 0 and self.salt:
            keys.append(self.salt)
        return tuple(keys) if keys else None

    def external(self, i):
        """maybe_convert_block_hash: bytes, or the int of the last 8 bytes."""
        h = self.hashes[i]
        return int.from_bytes(h[-8:], "big") if self.int_hashes else h


class Group:
    """One KV-cache group: its index and what KVCacheManager.take_events annotates stores with
    (get_kv_cache_spec_kind / get_kv_cache_spec_sliding_window), or nothing (older vLLM)."""

    def __init__(self, idx, kind=None, window=None):
        self.idx, self.kind, self.window = idx, kind, window


def stored(req, g, num_cached, num_full, mask=None, lora_id=None):
    """BlockPool.cache_full_blocks at vLLM main: blocks [num_cached, num_full) of req cached in
    group g. Null or masked blocks (sliding window, Mamba align) are left out of block_hashes
    and extra_keys but not of token_ids; the parent is the hash of block num_cached-1."""
    keep = [i for i in range(num_cached, num_full) if mask is None or mask[i - num_cached]]
    v = dict(
        block_hashes=[req.external(i) for i in keep],
        parent_block_hash=req.external(num_cached - 1) if num_cached else None,
        token_ids=req.tokens[num_cached * BS:num_full * BS], block_size=BS,
        lora_id=lora_id if req.lora else None, medium="GPU", lora_name=req.lora,
        extra_keys=[req.extra_keys(i) for i in keep] or None)
    if g is not None:
        v.update(group_idx=g.idx, kv_cache_spec_kind=g.kind, kv_cache_spec_sliding_window=g.window)
    return Event("BlockStored", **v)


def stored_with_context(req, g, context_start, start, end):
    """vLLM PR #44488's dense store: blocks [start, end) with parent block start-1, and the
    request's unannounced blocks [context_start, start) as skipped context."""
    ev = stored(req, g, start, end)
    ev.values.update(
        skipped_parent_block_hash=req.external(context_start - 1) if context_start else None,
        skipped_token_ids=req.tokens[context_start * BS:start * BS],
        skipped_extra_keys=[req.extra_keys(i) for i in range(context_start, start)])
    return ev


def partial(req, g, num_tokens, hash_bs):
    """BlockPool.cache_partial_block: a prefix entry at num_tokens inside a block, announced as
    a store of one hash_bs-token block (block_size = hash_bs)."""
    start = num_tokens - hash_bs
    return Event("BlockStored", block_hashes=[hashlib.sha256(b"partial" + req.hashes[0]).digest()],
                 parent_block_hash=req.external(start // BS - 1) if start >= BS else None,
                 token_ids=req.tokens[start:num_tokens], block_size=hash_bs, lora_id=None,
                 medium="GPU", lora_name=req.lora, extra_keys=[None], group_idx=g.idx,
                 kv_cache_spec_kind=g.kind, kv_cache_spec_sliding_window=g.window)


def removed(req, g, blocks):
    v = dict(block_hashes=[req.external(i) for i in blocks], medium="GPU")
    if g is not None:
        v["group_idx"] = g.idx
    return Event("BlockRemoved", **v)


def tail_mask(num_cached, num_full, window):
    """The SWA tail window: only the blocks a later hit can use stay in the prefix cache."""
    need = -(-(window - 1) // BS)
    return [i >= num_full - need for i in range(num_cached, num_full)]


def want_event(e):
    """What the decoder must read back from an event (hashes as the router keeps them: an int's
    low 64 bits, a digest's last 8 bytes)."""
    v = e.values

    def h(x):
        return None if x is None else str(x if isinstance(x, int) else int.from_bytes(x[-8:], "big"))

    def extras(keys):
        if keys is None:
            return None
        out = []
        for k in keys:
            k = k or ()
            strs = [s for s in k if isinstance(s, str)]
            lora = v.get("lora_name")
            if lora and strs and strs[0] == lora:
                strs = strs[1:]
            # Here the only other plain string is the cache salt (first block only).
            out.append({"media": [s[0] for s in k if isinstance(s, tuple)], "salt": strs[-1] if strs else ""})
        return out

    w = {"type": e.kind}
    if e.kind == "AllBlocksCleared":
        return w
    w.update(hashes=[h(x) for x in v["block_hashes"]], medium=v.get("medium") or "",
             group=v.get("group_idx"))
    if e.kind == "BlockStored":
        w.update(parent=h(v["parent_block_hash"]), tokens=v["token_ids"], block_size=v["block_size"],
                 lora_name=v.get("lora_name") or "", kind=v.get("kv_cache_spec_kind") or "",
                 window=v.get("kv_cache_spec_sliding_window") or 0,
                 extra=extras(v.get("extra_keys")),
                 skipped=v.get("skipped_token_ids") is not None,
                 skipped_parent=h(v.get("skipped_parent_block_hash")),
                 skipped_tokens=v.get("skipped_token_ids") or [],
                 skipped_extra=extras(v.get("skipped_extra_keys")))
    return w


def request_json(req, n=None, **over):
    toks = req.tokens if n is None else req.tokens[:n * BS]
    d = {"tokens": toks, "lora": req.lora or "", "salt": req.salt or "",
         "media": [{"id": i, "offset": o, "length": l} for i, o, l in req.mm]}
    d.update(over)
    return d


def scenario(name, about, batches, requests, stats, array_like=False, first_seq=0):
    return {"name": name, "about": about, "layout": "array" if array_like else "map",
            "batches": [{"seq": first_seq + k, "payload": batch(evs, array_like).hex(),
                         "events": [want_event(e) for e in evs]} for k, evs in enumerate(batches)],
            "requests": requests, "stats": stats}


def toks(rng, n):
    return [rng.randrange(0, 150000) for _ in range(n * BS)]


def main():
    rng = random.Random(20261124)
    out = []

    # gpt-oss: alternating sliding-window (128) and full-attention layers, two groups, the
    # sliding window first. Prefill caches 10 blocks: the window group only its tail (a sparse
    # store), the full group all; a decode step fills block 10; then the window group's blocks
    # that slid out are evicted (removes that name the same hashes the full group still holds).
    sw, full = Group(0, "sliding_window", 128), Group(1, "full_attention")
    r1 = Request(toks(rng, 11))
    other = Request(r1.tokens[:5 * BS] + toks(rng, 3))
    out.append(scenario(
        "gpt-oss", "sliding window (group 0) + full attention (group 1)",
        [[stored(r1, sw, 0, 10, tail_mask(0, 10, 128)), stored(r1, full, 0, 10)],
         [stored(r1, sw, 10, 11), stored(r1, full, 10, 11)],
         [removed(r1, sw, [2, 3, 4])]],
        [dict(request_json(r1), overlap=11), dict(request_json(other), overlap=5)],
        {"filtered_group": 3, "sparse_store": 0, "bad_event": 0, "unknown_block": 0}))

    # Gemma-3: one full-attention group (0) beside five sliding-window groups (1024 tokens);
    # short prompts fit the window, so the window groups store densely too. A window group's
    # eviction must not take the full group's blocks.
    groups = [Group(0, "full_attention")] + [Group(i, "sliding_window", 1024) for i in range(1, 6)]
    r1 = Request(toks(rng, 6), salt="tenant-a", mm=[("img-gemma", 20, 40)])
    out.append(scenario(
        "gemma-3", "full attention (group 0) + five sliding-window groups, salt and an image",
        [[stored(r1, g, 0, 6) for g in groups],
         [removed(r1, groups[3], [4, 5]), removed(r1, groups[0], [5])]],
        [dict(request_json(r1), overlap=5), dict(request_json(r1, salt=""), overlap=0)],
        {"filtered_group": 6, "unknown_block": 0}))

    # DeepSeek-V3: MLA, one group (mla_attention).
    mla = Group(0, "mla_attention")
    r1 = Request(toks(rng, 8), int_hashes=True)
    out.append(scenario(
        "deepseek-v3", "one MLA group (mla_attention), int hashes",
        [[stored(r1, mla, 0, 6)], [stored(r1, mla, 6, 8), removed(r1, mla, [7])]],
        [dict(request_json(r1), overlap=7)],
        {"filtered_group": 0, "unknown_parent": 0}))

    # DeepSeek-V4 style: a sliding-window MLA group first (group 0), the MLA group second.
    swmla, mla = Group(0, "sliding_window_mla", 128), Group(1, "mla_attention")
    r1 = Request(toks(rng, 12))
    out.append(scenario(
        "deepseek-v4", "sliding-window MLA (group 0) + MLA (group 1)",
        [[stored(r1, swmla, 0, 12, tail_mask(0, 12, 128)), stored(r1, mla, 0, 12)],
         [removed(r1, swmla, [4, 5, 6, 7])]],
        [dict(request_json(r1), overlap=12)],
        {"filtered_group": 2, "sparse_store": 0}))

    # vLLM with group_idx but without kv_cache_spec_kind: the router cannot tell the groups
    # apart and follows the first one a store names (today's behaviour, README.md). Here that is
    # a sliding-window group: its sparse stores are dropped as such, its dense ones followed.
    g0, g1 = Group(0), Group(1)
    r1 = Request(toks(rng, 10))
    out.append(scenario(
        "no-kinds", "group_idx without kv_cache_spec_kind: the first group a store names",
        [[stored(r1, g0, 0, 4), stored(r1, g1, 0, 4)],
         [stored(r1, g0, 4, 10, tail_mask(4, 10, 64)), stored(r1, g1, 4, 10)]],
        [dict(request_json(r1), overlap=4)],
        {"filtered_group": 2, "sparse_store": 1}))

    # Older vLLM (array_like, no group fields): every event counts.
    r1 = Request(toks(rng, 5), lora="adapter-1")
    out.append(scenario(
        "array-no-groups", "array_like layout, no group fields, a LoRA",
        [[stored(r1, None, 0, 3, lora_id=7)], [stored(r1, None, 3, 5, lora_id=7), removed(r1, None, [4])]],
        [dict(request_json(r1), overlap=4)],
        {"filtered_group": 0}, array_like=True))

    # Skipped context (vLLM PR #44488), one full-attention group. r1's store (seq 0) is
    # published before the router attaches, and the engine's replay buffer no longer has it:
    # the router sees from seq 5 on. r2 hits r1's cached prefix (blocks 0-3: salt, an image)
    # and caches blocks 4-6; vLLM never announced blocks 0-3 for r2, so the store carries them
    # as skipped context from the root, and its parent (block 3) is one the router never saw.
    # The router hashes the context to reach the parent; the decode step after it (block 7)
    # chains to block 6. A partial prefix entry (hash block size 8) is announced with another
    # block size. Later a request that hits the same 4 blocks under kv_cache_report_mode=full
    # re-announces them (emit_cached_block_events): from then on r2's whole prefix matches.
    # Last, a request resumes (after preemption) with a longer prefix hit than it announced:
    # its store's skipped context starts at its last announced block, which the router knows,
    # and spans blocks whose announcement the router missed.
    full = Group(0, "full_attention")
    prefix = toks(rng, 4)
    r1 = Request(prefix + toks(rng, 1), salt="tenant-b", mm=[("img-7", 20, 30)])
    r2 = Request(prefix + toks(rng, 5), salt="tenant-b", mm=[("img-7", 20, 30)])
    r3 = Request(prefix + toks(rng, 3), salt="tenant-b", mm=[("img-7", 20, 30)])
    r4 = Request(toks(rng, 6))
    replay = stored(r3, full, 0, 4)  # emit_cached_block_events: the hit, from the root
    out.append(scenario(
        "skipped-context", "stores with skipped context (vLLM PR #44488), a partial store",
        [[stored(r1, full, 0, 5)],  # seq 0: before the router attached
         [stored_with_context(r2, full, 0, 4, 7)],
         [stored(r2, full, 7, 8), partial(r2, full, 8 * BS + 8, 8)],
         [replay],
         [stored(r4, full, 0, 1)],
         [stored_with_context(r4, full, 1, 3, 6)]],
        [dict(request_json(r2), overlap=8), dict(request_json(r1), overlap=4),
         dict(request_json(r2, salt=""), overlap=0), dict(request_json(r4), overlap=1)],
        {"skipped_context": 2, "unknown_parent": 0, "block_size_mismatch": 1},
        first_seq=4))
    out[-1]["skip_batches"] = 1  # the router never sees the first

    with open("vllm_events.json", "w") as f:
        json.dump({"block_size": BS, "scenarios": out}, f)


if __name__ == "__main__":
    main()
