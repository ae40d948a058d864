package synth

import (
	"dataplane/dataplane/media/video"
	"dataplane/dataplane/sequence"
	"fmt"
	"math"
	"math/rand/v2"
)

// Knobs shape a synthesized trace. DefaultKnobs reproduces the source trace's statistics.
type Knobs struct {
	Requests int    // how many requests; 0: as many as the source trace
	Seed     uint64 // 0: random

	PrefixLenMultiplier  float64 // scales every shared segment's length; 1
	PrefixRootMultiplier int     // independent copies of the core tree (less sharing); 1
	PromptLenMultiplier  float64 // scales each request's unique (unshared) blocks; 1
	OSLMultiplier        float64 // scales output lengths; 1
	SpeedupRatio         float64 // divides inter-arrival times; 1

	// Multimodal: the share of requests with an item of each modality (placed at the start of
	// the request's new, unshared part), its size in tokens, and the probability that an item
	// repeats one already used in the same conversation (requests ending in the same core-tree
	// segment) instead of being new.
	ImageShare, VideoShare, AudioShare    float64 // 0
	ImageTokens, VideoTokens, AudioTokens int     // 576 (LLaVA-1.5), 0 (videos: from their frames), 750 (Qwen2-Audio, 30 s)
	MediaReuse                            float64 // 0
	// A video is VideoFrames frames sampled at VideoFPS (its length is frames / fps); unless
	// VideoTokens is set, its tokens are the daemon's count (dataplane/media/video.TokenCount):
	// ceil(frames / VideoPool) × VideoFrameTokens, Qwen2-VL's temporal patch of 2 frames sharing
	// one set of tokens. Defaults: 30 frames at 2 fps, pool 2, 256 tokens (a 448×448 frame pair
	// after the 2×2 merge): 3,840 tokens.
	VideoFrames, VideoPool, VideoFrameTokens int
	VideoFPS                                 float64
}

// VideoTokenCount is a video's tokens under k: VideoTokens if set, else from its frames.
func (k *Knobs) VideoTokenCount() int {
	if k.VideoTokens > 0 {
		return k.VideoTokens
	}
	return video.TokenCount(k.VideoFrames, k.VideoFrameTokens, k.VideoPool)
}

// DefaultKnobs change nothing.
func DefaultKnobs() Knobs {
	return Knobs{PrefixLenMultiplier: 1, PrefixRootMultiplier: 1, PromptLenMultiplier: 1, OSLMultiplier: 1, SpeedupRatio: 1,
		ImageTokens: 576, AudioTokens: 750, VideoFrames: 30, VideoFPS: 2, VideoPool: 2, VideoFrameTokens: 256}
}

// ErrKnob names a knob with an unusable value.
type ErrKnob struct{ Knob, Problem string }

func (e *ErrKnob) Error() string { return "synth: " + e.Knob + " " + e.Problem }

func (k *Knobs) check() error {
	pos := func(name string, v float64) error {
		if !(v > 0) || math.IsInf(v, 0) {
			return &ErrKnob{name, fmt.Sprintf("%v: must be positive", v)}
		}
		return nil
	}
	share := func(name string, v float64) error {
		if !(v >= 0 && v <= 1) {
			return &ErrKnob{name, fmt.Sprintf("%v: want 0..1", v)}
		}
		return nil
	}
	for _, err := range []error{
		pos("prefix_len_multiplier", k.PrefixLenMultiplier), pos("prompt_len_multiplier", k.PromptLenMultiplier),
		pos("osl_multiplier", k.OSLMultiplier), pos("speedup_ratio", k.SpeedupRatio),
		share("image_share", k.ImageShare), share("video_share", k.VideoShare), share("audio_share", k.AudioShare),
		share("media_reuse", k.MediaReuse),
	} {
		if err != nil {
			return err
		}
	}
	switch {
	case k.PrefixRootMultiplier < 1:
		return &ErrKnob{"prefix_root_multiplier", fmt.Sprintf("%d: want at least 1", k.PrefixRootMultiplier)}
	case k.Requests < 0:
		return &ErrKnob{"requests", fmt.Sprintf("%d: must not be negative", k.Requests)}
	case k.ImageTokens <= 0 || k.VideoTokens < 0 || k.AudioTokens <= 0:
		return &ErrKnob{"media tokens", fmt.Sprintf("%d/%d/%d: must be positive (video: or 0, from its frames)", k.ImageTokens, k.VideoTokens, k.AudioTokens)}
	case k.VideoFrames <= 0 || k.VideoPool <= 0 || k.VideoFrameTokens <= 0:
		return &ErrKnob{"video", fmt.Sprintf("%d frames, pool %d, %d tokens a frame group: must be positive", k.VideoFrames, k.VideoPool, k.VideoFrameTokens)}
	case !(k.VideoFPS > 0) || math.IsInf(k.VideoFPS, 0):
		return &ErrKnob{"video_fps", fmt.Sprintf("%v: must be positive", k.VideoFPS)}
	}
	return nil
}

// provenance is how a synthesized request was put together (for tests and summaries).
type provenance struct {
	copy          int
	prefixBlocks  int // from the core tree
	uniqueBlocks  int // new blocks (the sampled unique suffix)
	mediaBlocks   int // blocks added to hold media
	conversation  int32
	sampledOutput int
}

// Synthesize samples a new trace from t: each request walks the core tree from the root,
// moving to a child with probability child count / node count or stopping with probability
// end / count (the source's Markov transitions), then gets the unique suffix and last-block
// length of a source request that stopped at the same node, and an output length and
// inter-arrival gap drawn from the source's distributions, each scaled by its knob. Every aspect draws from its own random stream, so a knob changes only what it scales.
func Synthesize(t *Tree, k Knobs) ([]Record, error) {
	recs, _, err := synthesize(t, k)
	return recs, err
}

func synthesize(t *Tree, k Knobs) ([]Record, []provenance, error) {
	if err := k.check(); err != nil {
		return nil, nil, err
	}
	if len(t.UniqueBlocks) == 0 {
		return nil, nil, &ErrKnob{"source trace", "is empty"}
	}
	if err := t.Check(); err != nil {
		return nil, nil, err
	}
	n := k.Requests
	if n == 0 {
		n = len(t.UniqueBlocks)
	}
	seed := k.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	stream := func(i uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, i)) }
	rPath, rRoot, rUnique, rOSL, rGap, rMedia := stream(1), stream(2), stream(3), stream(5), stream(6), stream(7)

	bs := t.BlockSize
	nextShared, nextNew := int64(0), int64(1)<<40 // core-tree blocks and new blocks: separate id ranges
	segIDs := map[[2]int32][]int64{}              // (tree copy, node) → its blocks' ids
	pools := map[[3]int32][]string{}              // (tree copy, conversation node, modality) → media ids used there
	mediaCount := 0
	recs := make([]Record, 0, n)
	prov := make([]provenance, 0, n)
	now := 0.0
	for i := range n {
		var p provenance
		p.copy = rRoot.IntN(k.PrefixRootMultiplier)
		var ids []int64
		node := int32(0)
		for {
			nd := &t.Nodes[node]
			u := rPath.IntN(nd.Count)
			if u < nd.End {
				break
			}
			u -= nd.End
			for _, c := range nd.Children {
				if u < t.Nodes[c].Count {
					node = c
					break
				}
				u -= t.Nodes[c].Count
			}
			key := [2]int32{int32(p.copy), node}
			seg, ok := segIDs[key]
			if !ok {
				m := max(int(math.Round(float64(t.Nodes[node].Blocks)*k.PrefixLenMultiplier)), 1)
				for range m {
					seg = append(seg, nextShared)
					nextShared++
				}
				segIDs[key] = seg
			}
			ids = append(ids, seg...)
		}
		p.prefixBlocks, p.conversation = len(ids), node
		ends := t.Nodes[node].Ends
		like := ends[rUnique.IntN(len(ends))] // a source request that stopped here too
		p.uniqueBlocks = int(math.Round(float64(t.UniqueBlocks[like]) * k.PromptLenMultiplier))
		if len(ids)+p.uniqueBlocks == 0 {
			p.uniqueBlocks = 1
		}
		last := t.LastTokens[like]
		rec := Record{InputLength: (len(ids)+p.uniqueBlocks-1)*bs + last}
		p.sampledOutput = t.OutputLength[rOSL.IntN(len(t.OutputLength))]
		rec.OutputLength = int(math.Round(float64(p.sampledOutput) * k.OSLMultiplier))
		if p.sampledOutput > 0 {
			rec.OutputLength = max(rec.OutputLength, 1)
		}
		if i > 0 && len(t.Gaps) > 0 {
			now += t.Gaps[rGap.IntN(len(t.Gaps))] / k.SpeedupRatio
		}
		rec.Timestamp = now
		// Media go at the start of the new part (a prompt that ends inside its last shared block
		// is first filled to the block's end), each making the prompt longer.
		offset := len(ids) * bs
		mediaAt := func() {
			rec.InputLength = max(rec.InputLength, offset)
		}
		for mi, mod := range []struct {
			modality sequence.Modality
			share    float64
			tokens   int
		}{{sequence.Image, k.ImageShare, k.ImageTokens}, {sequence.Video, k.VideoShare, k.VideoTokenCount()}, {sequence.Audio, k.AudioShare, k.AudioTokens}} {
			has, reuse, pick := rMedia.Float64() < mod.share, rMedia.Float64() < k.MediaReuse, rMedia.Uint64()
			if !has {
				continue
			}
			var id string
			pool := [3]int32{int32(p.copy), node, int32(mi)}
			used := pools[pool]
			if reuse && len(used) > 0 {
				id = used[pick%uint64(len(used))]
			} else {
				mediaCount++
				id = fmt.Sprintf("%v-%d-%d", mod.modality, seed%100000, mediaCount)
				pools[pool] = append(used, id)
			}
			mediaAt()
			m := Media{Modality: mod.modality, ID: id, Offset: offset, Tokens: mod.tokens}
			if mod.modality == sequence.Video {
				m.Frames, m.FPS = k.VideoFrames, k.VideoFPS
			}
			rec.Media = append(rec.Media, m)
			offset += mod.tokens
			rec.InputLength += mod.tokens
		}
		total := (rec.InputLength + bs - 1) / bs
		p.mediaBlocks = total - len(ids) - p.uniqueBlocks
		for len(ids) < total {
			ids = append(ids, nextNew)
			nextNew++
		}
		rec.HashIDs = ids
		recs = append(recs, rec)
		prov = append(prov, p)
	}
	return recs, prov, nil
}
