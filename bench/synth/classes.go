package synth

import "dataplane/dataplane/sequence"

// Request classes, for results reported per class.
const (
	ClassText  = "text-only"
	ClassImage = "image"
	ClassAudio = "audio"
	ClassVideo = "video"
)

// Classes lists the classes in report order.
var Classes = []string{ClassText, ClassImage, ClassAudio, ClassVideo}

// Class is a request's class: text-only without media, else its heaviest media kind by
// encoder work, video > audio > image (a 30-frame video costs tens of images; a 30 s clip's
// 750 audio tokens more than one image's 576), so a request is counted where its wait comes from.
func Class(rec *Record) string {
	c := ClassText
	rank := map[string]int{ClassText: 0, ClassImage: 1, ClassAudio: 2, ClassVideo: 3}
	for _, m := range rec.Media {
		k := ClassImage
		switch m.Modality {
		case sequence.Video:
			k = ClassVideo
		case sequence.Audio:
			k = ClassAudio
		}
		if rank[k] > rank[c] {
			c = k
		}
	}
	return c
}

// WithoutMedia is recs with every media item taken out: each prompt is its text alone (media
// tokens removed, later items' offsets and the prompt's length shortened, hash ids cut to the
// shorter prompt's blocks) at the same time with the same output. The blocks before a
// request's first item keep their ids, so the shared prefixes are the same; blocks after it
// are, in synthesized traces, the request's own. The same trace without media: the baseline
// that says what media cost the text-only requests.
func WithoutMedia(recs []Record, blockSize int) []Record {
	out := make([]Record, len(recs))
	for i, r := range recs {
		for _, m := range r.Media {
			r.InputLength -= m.Tokens
		}
		if len(r.Media) > 0 {
			r.InputLength = max(r.InputLength, 1)
			r.HashIDs = r.HashIDs[:min(len(r.HashIDs), (r.InputLength+blockSize-1)/blockSize)]
		}
		r.Media = nil
		out[i] = r
	}
	return out
}
