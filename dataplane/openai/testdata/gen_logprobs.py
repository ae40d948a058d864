#!/usr/bin/env python3
"""Logprobs as vLLM's OpenAI server writes them, for dataplane/openai and dataplane/api tests.

Written from vLLM's source (vllm-project/vllm), not copied:
  - completions layout: vllm/entrypoints/openai/completion/serving.py at 030ea52e,
    OpenAIServingCompletion._create_completion_logprobs (and the stream generator, which calls
    it per chunk with initial_text_offset = the length of the text streamed so far);
  - chat layout: vllm/entrypoints/openai/chat_completion/serving.py at 006c49d4,
    OpenAIServingChat._create_chat_logprobs and _get_top_logprobs;
  - a position's logprobs are a dict token id -> Logprob whose first entry is the sampled
    token, then the top-k by rank (vllm/v1/engine/logprobs.py); a sampled token that is also
    in the top-k appears once.

For each case the engine's steps (token id, its dict) go through both writers: "chunks" are
the completions-layout logprobs of each streamed chunk (what /v1/completions streams),
"completion" the whole completion's, "chat" what vLLM's chat endpoint would answer for the
same steps with top_logprobs = k. Run: python3 gen_logprobs.py > logprobs.json
"""
import json

# A tiny vocabulary: id -> decoded text (what Logprob.decoded_token holds).
VOCAB = {
    1: "The", 2: " cat", 3: " sat", 4: ".", 5: " dog", 6: " é", 7: " 猫", 8: "\n",
    9: " on", 10: "🙂", 11: " a", 12: "\ufffd",
}

NEG_INF = float("-inf")


def step(sampled, ranked):
    """A position's dict: the sampled token first, then ranked (id, logprob), each id once."""
    d = {sampled[0]: sampled[1]}
    for tid, lp in ranked:
        if tid not in d:
            d[tid] = lp
    return sampled[0], d


def completion_logprobs(steps, k, initial_text_offset=0):
    """_create_completion_logprobs: the first k+1 entries of each dict, -inf clamped."""
    text_offset, token_logprobs, tokens, top = [], [], [], []
    last_len = 0
    for tid, d in steps:
        tok = VOCAB[tid]
        tokens.append(tok)
        token_logprobs.append(max(d[tid], -9999.0))
        top.append({VOCAB[t]: max(lp, -9999.0) for i, (t, lp) in enumerate(d.items()) if k >= i})
        text_offset.append(initial_text_offset if not text_offset else text_offset[-1] + last_len)
        last_len = len(tok)  # characters, as Python counts them
    return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": top}


def chat_logprobs(steps, k):
    """_create_chat_logprobs with top_logprobs = k: the first k entries of each dict."""
    content = []
    for tid, d in steps:
        tok = VOCAB[tid]
        content.append({
            "token": tok,
            "logprob": max(d[tid], -9999.0),
            "bytes": list(tok.encode("utf-8", errors="replace")),
            "top_logprobs": [
                {"token": VOCAB[t], "logprob": max(lp, -9999.0), "bytes": list(VOCAB[t].encode("utf-8", errors="replace"))}
                for i, (t, lp) in enumerate(d.items()) if i < k
            ],
        })
    return {"content": content}


def case(name, k, steps, chunk_sizes):
    chunks, off, i = [], 0, 0
    for n in chunk_sizes:
        part = steps[i:i + n]
        chunks.append({"text": "".join(VOCAB[t] for t, _ in part), "logprobs": completion_logprobs(part, k, off)})
        off += sum(len(VOCAB[t]) for t, _ in part)
        i += n
    assert i == len(steps)
    return {"name": name, "k": k, "chunks": chunks, "text": "".join(VOCAB[t] for t, _ in steps),
            "completion": completion_logprobs(steps, k), "chat": chat_logprobs(steps, k)}


cases = [
    # sampled token only (logprobs=0 / top_logprobs=0)
    case("k0", 0, [step((1, -0.25), [(1, -0.25)]), step((2, -1.5), [(5, -0.5)]), step((4, -0.125), [])], [1, 1, 1]),
    # k=2: the sampled token outside the top 2 (3 entries), inside it (2 entries), non-ASCII text,
    # an impossible token (-inf -> -9999), two tokens in one chunk
    case("k2", 2, [
        step((1, -0.5), [(1, -0.5), (11, -1.25)]),
        step((6, -3.0), [(2, -0.75), (5, -1.0)]),
        step((7, NEG_INF), [(3, -0.0625), (9, -2.5)]),
        step((10, -0.875), [(10, -0.875), (12, -4.0)]),
        step((8, -1.0), [(4, -0.5), (8, -1.0)]),
    ], [1, 2, 2]),
    # k=5 with fewer alternatives than asked
    case("k5", 5, [step((3, -2.0), [(9, -0.1), (3, -2.0)]), step((4, -0.01), [(4, -0.01)])], [2]),
]
print(json.dumps(cases, ensure_ascii=False, indent=1))
