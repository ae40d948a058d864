#!/usr/bin/env python3
"""Writes tokens.json: the token counts (and grid geometry) transformers' processors and vLLM
give for a table of picture sizes and audio lengths, under the released processor configs in
configs/. An independent reference: written from transformers' and vLLM's source (files and
commits below and in README.md), reading the config files as they do. Plain Python, no
transformers package:

    python3 dataplane/media/hfproc/testdata/gen_tokens.py

Sources (huggingface/transformers unless said otherwise):
- Qwen2-VL smart_resize: src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py after
  PR #38706 (merged 2025-06-10, v4.53; vLLM requires transformers >= 4.56): no "height < factor"
  error, max(factor, ...) in the downscale branch; the aspect-ratio limit of 200 remains.
  Tokens: grid_h * grid_w // merge_size**2 (processing_qwen2_vl.py).
- LLaVA-1.5: processing_llava.py: (height // patch_size) * (width // patch_size)
  + num_additional_image_tokens, less that when vision_feature_select_strategy == "default";
  height, width are the processed picture's (crop_size).
- LLaVA-NeXT: image_processing_utils.py select_best_resolution and get_patch_output_size
  (commit d05a9215); processing_llava_next.py _get_number_of_features / _get_unpadded_features
  (the int(round(x, 7)) form, as in transformers' current copies); image_processing_pil_llava_next.py
  (commit f5956fde) for the padding offsets (divmod of the difference by 2).
- InternVL 2 / 2.5: vllm-project/vllm vllm/model_executor/models/internvl.py (commit b32b213e):
  get_internvl_target_ratios, find_closest_aspect_ratio, calculate_internvl_targets,
  num_image_token = int((image_size // patch_size) ** 2 * downsample_ratio ** 2).
- SigLIP: (size // patch_size) ** 2 (the vision tower's patch grid; no CLS token).
- Qwen2-Audio: models/whisper/feature_extraction_whisper.py __call__ (commit 2b897410):
  truncation=True and max_length = n_samples by default, attention mask [:: hop_length];
  processing_qwen2_audio.py (commit 718881e4) and vllm qwen2_audio.py (commit cd1e8452):
  L = mask.sum(), (L - 1) // 2 + 1, then (that - 2) // 2 + 1 tokens.
- Whisper: openai/whisper whisper/transcribe.py: mel of the audio + 30 s of zeros, content
  frames = frames - 3000, 30 s windows from frame 0 while there are content frames
  (a preprocessor cannot know where decoding moves the next window: every 3000 frames), 1500
  encoder rows a window.
"""
import json, math, os

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "configs")

# (width, height): tiny, under / at 28 px, odd aspect ratios, landscape and portrait photos.
SIZES = [(1, 1), (10, 10), (27, 300), (28, 28), (28, 500), (500, 28), (29, 29), (56, 56), (100, 2000),
         (2000, 100), (28, 5600), (5601, 28), (333, 777), (640, 480), (1000, 1000), (1001, 999),
         (1100, 808), (1024, 768), (1920, 1080), (1080, 1920), (4000, 3000), (3000, 4000), (8000, 500),
         (448, 448), (672, 336), (336, 1008), (7, 4000),
         (55, 88), (99, 88), (110, 88), (47, 94)]  # the last: LLaVA-NeXT products a float error below a whole number
SECONDS = [0.02, 0.021, 1, 29.9, 30, 45, 90]
RATE = 16000


def load(name):
    out = {}
    for f in ("preprocessor_config.json", "processor_config.json", "config.json"):
        p = os.path.join(CONFIGS, name, f)
        if os.path.exists(p):
            with open(p) as fh:
                out[f] = json.load(fh)
    return out


# --- Qwen2-VL / Qwen2.5-VL ---------------------------------------------------------------

def smart_resize(height, width, factor, min_pixels, max_pixels):
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen(cfg, w, h):
    pre = cfg["preprocessor_config.json"]
    size = pre.get("size") or {}
    lo = pre.get("min_pixels", size.get("shortest_edge", 56 * 56))  # min_pixels overrides size
    hi = pre.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))
    patch, merge = pre.get("patch_size", 14), pre.get("merge_size", 2)
    rh, rw = smart_resize(h, w, patch * merge, lo, hi)
    gh, gw = rh // patch, rw // patch
    return {"tokens": gh * gw // (merge * merge), "resized": [rh, rw], "grid": [1, gh, gw]}


# --- LLaVA-1.5 (CLIP) and SigLIP ---------------------------------------------------------

def llava(cfg, w, h):
    pre, proc = cfg["preprocessor_config.json"], cfg["processor_config.json"]
    crop = pre["crop_size"]
    n = (crop["height"] // proc["patch_size"]) * (crop["width"] // proc["patch_size"]) + proc["num_additional_image_tokens"]
    if proc["vision_feature_select_strategy"] == "default":
        n -= proc["num_additional_image_tokens"]
    return {"tokens": n}


def siglip(cfg, w, h):
    size, patch = cfg["preprocessor_config.json"]["size"], cfg["config.json"]["vision_config"]["patch_size"]
    return {"tokens": (size["height"] // patch) * (size["width"] // patch)}


# --- LLaVA-NeXT ----------------------------------------------------------------------------

def select_best_resolution(original_size, possible_resolutions):
    original_height, original_width = original_size
    best_fit, max_effective, min_wasted = None, 0, float("inf")
    for height, width in possible_resolutions:
        scale = min(width / original_width, height / original_height)
        dw, dh = int(original_width * scale), int(original_height * scale)
        effective = min(dw * dh, original_width * original_height)
        wasted = (width * height) - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best_fit = effective, wasted, (height, width)
    return best_fit


def get_patch_output_size(original_height, original_width, target_resolution):
    target_height, target_width = target_resolution
    scale_w, scale_h = target_width / original_width, target_height / original_height
    if scale_w < scale_h:
        return min(math.ceil(original_height * scale_w), target_height), target_width
    return target_height, min(math.ceil(original_width * scale_h), target_width)


def unpadded_features(height, width, patches_height, patches_width, scale_height, scale_width):
    current_height, current_width = patches_height * scale_height, patches_width * scale_width
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        current_height -= (current_height - new_height) // 2 * 2
    else:
        new_width = int(round(width * (current_height / height), 7))
        current_width -= (current_width - new_width) // 2 * 2
    return current_height, current_width


def llava_next(cfg, w, h):
    pre, proc = cfg["preprocessor_config.json"], cfg["processor_config.json"]
    tile = pre["crop_size"]["height"]  # the processed picture's side
    pins = pre["image_grid_pinpoints"]
    bh, bw = select_best_resolution([h, w], pins)
    ph = pw = tile // proc["patch_size"]
    fh, fw = unpadded_features(h, w, ph, pw, bh // tile, bw // tile)
    n = fh * fw + fh + ph * pw + proc["num_additional_image_tokens"]
    if proc["vision_feature_select_strategy"] == "default":
        n -= proc["num_additional_image_tokens"]
    rh, rw = get_patch_output_size(h, w, (bh, bw))
    pad_top, pad_left = divmod(bh - rh, 2)[0], divmod(bw - rw, 2)[0]
    return {"tokens": n, "best": [bh, bw], "tiles": [bh // tile, bw // tile], "resized": [rh, rw],
            "pad": [pad_top, pad_left], "features": [fh, fw]}


# --- InternVL 2 / 2.5 (vLLM's processor) -------------------------------------------------

def target_ratios(min_num, max_num):
    ratios = {(i, j) for n in range(min_num, max_num + 1) for i in range(1, n + 1) for j in range(1, n + 1)
              if min_num <= i * j <= max_num}
    return sorted(ratios, key=lambda x: x[0] * x[1])


def closest_aspect_ratio(aspect, ratios, width, height, image_size):
    best_diff, best = float("inf"), (1, 1)
    area = width * height
    for r in ratios:
        diff = abs(aspect - r[0] / r[1])
        if diff < best_diff:
            best_diff, best = diff, r
        elif diff == best_diff and area > 0.5 * image_size * image_size * r[0] * r[1]:
            best = r
    return best


def internvl(cfg, w, h):
    c = cfg["config.json"]
    size, patch = c["vision_config"]["image_size"], c["vision_config"]["patch_size"]
    lo, hi = (c["min_dynamic_patch"], c["max_dynamic_patch"]) if c["dynamic_image_size"] else (1, 1)
    per_tile = int((size // patch) ** 2 * (c["downsample_ratio"] ** 2))
    cols, rows = closest_aspect_ratio(w / h, target_ratios(lo, hi), w, h, size)
    blocks = cols * rows
    if c["use_thumbnail"] and blocks != 1:
        blocks += 1
    return {"tokens": blocks * per_tile, "grid": [cols, rows], "tiles": blocks}


# --- audio -------------------------------------------------------------------------------

def qwen2_audio(cfg, n):
    fe = cfg["preprocessor_config.json"]
    kept = min(n, fe["n_samples"])  # truncation=True, max_length=n_samples, padding="max_length"
    mask = [1] * kept + [0] * (fe["n_samples"] - kept)
    length = sum(mask[:: fe["hop_length"]])
    feat = (length - 1) // 2 + 1
    tokens = (feat - 2) // 2 + 1
    if tokens == 0:  # vLLM's qwen2_audio.py: "is too short to be represented inside the model"
        raise ValueError("too short to be represented inside the model")
    return {"tokens": tokens, "windows": 1}


def whisper(cfg, n):
    fe = cfg["preprocessor_config.json"]
    frames = (n + fe["n_samples"]) // fe["hop_length"]  # STFT of audio + 30 s zeros, last frame dropped
    content = frames - fe["nb_max_frames"]
    windows = len(range(0, content, fe["nb_max_frames"]))
    return {"tokens": windows * fe["nb_max_frames"] // 2, "windows": windows}


IMAGE = {"qwen2-vl-7b-instruct": qwen, "qwen2.5-vl-7b-instruct": qwen, "llava-1.5-7b-hf": llava,
         "llava-v1.6-mistral-7b-hf": llava_next, "internvl2_5-8b": internvl, "siglip-so400m-patch14-384": siglip}
AUDIO = {"qwen2-audio-7b-instruct": qwen2_audio, "whisper-base": whisper}

out = {"images": [], "audio": [], "sweeps": {}}
for name, fn in IMAGE.items():
    cfg = load(name)
    for w, h in SIZES:
        row = {"config": name, "width": w, "height": h}
        try:
            row.update(fn(cfg, w, h))
        except ValueError as e:
            row["error"] = str(e)
        out["images"].append(row)
for name, fn in AUDIO.items():
    cfg = load(name)
    for s in SECONDS:
        n = round(s * RATE)
        row = {"config": name, "seconds": s, "samples": n}
        try:
            row.update(fn(cfg, n))
        except ValueError as e:
            row["error"] = str(e)
        out["audio"].append(row)

# Sweeps over many shapes for the families whose counts turn on float arithmetic: every size
# w x h for w, h in a grid of steps (LLaVA-NeXT's unpadding and best resolution, InternVL's
# closest ratio and its ties, smart_resize's rounding).
steps = sorted({1, 2, 3, 5, 7, 13, 27, 28, 29, 55, 56, 57, 100, 111, 224, 300, 335, 336, 337, 447, 448, 449, 500,
                671, 672, 673, 799, 1000, 1007, 1008, 1009, 1343, 1344, 1999, 2016, 3001})
for name, fn in (("llava-v1.6-mistral-7b-hf", llava_next), ("internvl2_5-8b", internvl), ("qwen2-vl-7b-instruct", qwen)):
    cfg, rows = load(name), []
    for w in steps:
        for h in steps:
            try:
                rows.append([w, h, fn(cfg, w, h)["tokens"]])
            except ValueError:
                rows.append([w, h, -1])
    out["sweeps"][name] = rows

with open(os.path.join(HERE, "tokens.json"), "w") as f:
    json.dump(out, f, indent=1)
print(len(out["images"]), "image cells,", len(out["audio"]), "audio cells,",
      sum(len(v) for v in out["sweeps"].values()), "sweep cells")
