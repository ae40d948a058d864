package synth

import (
	"math/rand/v2"

	"dataplane/dataplane/sequence"
	"dataplane/dataplane/worker"
)

// Placeholder token ids media items occupy in synthesized prompts (what a model's image,
// video and audio placeholder tokens would be).
const (
	ImageToken = 1
	VideoToken = 2
	AudioToken = 3
)

// PromptTokens makes a record's prompt concrete, for replay against engines: each hash id's
// block is blockSize token ids drawn from a generator seeded by the id (equal ids, equal
// blocks; the last block cut to the prompt's length), and each media item's tokens are its
// modality's placeholder. It returns the tokens and the media spans (for KV-event extra keys
// and router hashes).
func PromptTokens(rec *Record, blockSize, vocab int) ([]int32, []worker.MediaSpan) {
	toks := make([]int32, 0, rec.InputLength)
	for _, id := range rec.HashIDs {
		r := rand.New(rand.NewPCG(uint64(id), 0x6d6f6f6e))
		for range min(blockSize, rec.InputLength-len(toks)) {
			toks = append(toks, int32(4+r.IntN(vocab-4)))
		}
	}
	var spans []worker.MediaSpan
	for _, m := range rec.Media {
		ph := int32(ImageToken)
		switch m.Modality {
		case sequence.Video:
			ph = VideoToken
		case sequence.Audio:
			ph = AudioToken
		}
		for i := m.Offset; i < m.Offset+m.Tokens; i++ {
			toks[i] = ph
		}
		spans = append(spans, worker.MediaSpan{Start: m.Offset, End: m.Offset + m.Tokens, ID: m.ID})
	}
	return toks, spans
}
