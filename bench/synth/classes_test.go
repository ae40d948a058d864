package synth

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/sequence"
)

// A video's tokens follow its frames as the daemon counts them (Qwen2-VL: two frames share a
// temporal patch's tokens; an odd count is padded to the next pair), unless set outright; its
// items record frames and rate.
func TestVideoFrames(t *testing.T) {
	k := DefaultKnobs()
	require.Equal(t, 15*256, k.VideoTokenCount(), "30 frames, 2 a patch, 256 tokens a patch")
	k.VideoFrames = 31
	require.Equal(t, 16*256, k.VideoTokenCount())
	k.VideoTokens = 1000
	require.Equal(t, 1000, k.VideoTokenCount())

	tree := &Tree{BlockSize: 512, Nodes: []Node{{Count: 1, End: 1, Ends: []int32{0}}}, UniqueBlocks: []int{1}, LastTokens: []int{3}, OutputLength: []int{2}, Gaps: []float64{10}}
	k = DefaultKnobs()
	k.VideoShare, k.VideoFrames, k.VideoFPS, k.Requests, k.Seed = 1, 8, 4, 3, 1
	out, err := Synthesize(tree, k)
	require.NoError(t, err)
	for _, r := range out {
		require.Len(t, r.Media, 1)
		require.Equal(t, Media{Modality: sequence.Video, ID: r.Media[0].ID, Offset: 0, Tokens: 4 * 256, Frames: 8, FPS: 4}, r.Media[0])
	}
	k.VideoFPS = 0
	_, err = Synthesize(tree, k)
	var ke *ErrKnob
	require.ErrorAs(t, err, &ke)
	require.Equal(t, "video_fps", ke.Knob)
	// Frames and rate survive a round trip; bad ones are refused by line.
	var buf bytes.Buffer
	require.NoError(t, WriteTrace(&buf, out))
	back, err := ReadTrace(&buf, DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, out, back)
	_, err = ReadTrace(bytes.NewBufferString(`{"timestamp": 0, "input_length": 10, "hash_ids": [1], "media": [{"modality": "video", "id": "x", "offset": 0, "tokens": 4, "frames": -1}]}`), DefaultLimits())
	require.ErrorContains(t, err, "media[0].frames -1")
}

// A request's class is its heaviest media kind; without media, the same prompts are their
// text alone: the shared prefix kept, the media's tokens and blocks gone.
func TestClassAndWithoutMedia(t *testing.T) {
	img := Media{Modality: sequence.Image, ID: "i", Offset: 512, Tokens: 100}
	vid := Media{Modality: sequence.Video, ID: "v", Offset: 612, Tokens: 600, Frames: 4, FPS: 2}
	aud := Media{Modality: sequence.Audio, ID: "a", Offset: 1212, Tokens: 50}
	recs := []Record{
		{Timestamp: 0, InputLength: 600, OutputLength: 3, HashIDs: []int64{1, 2}},
		{Timestamp: 1, InputLength: 700, OutputLength: 4, HashIDs: []int64{1, 3}, Media: []Media{img}},
		{Timestamp: 2, InputLength: 1300, OutputLength: 5, HashIDs: []int64{1, 4, 5}, Media: []Media{img, vid, aud}},
		{Timestamp: 3, InputLength: 1300, OutputLength: 5, HashIDs: []int64{1, 6, 7}, Media: []Media{img, aud}},
	}
	var classes []string
	for i := range recs {
		classes = append(classes, Class(&recs[i]))
	}
	require.Equal(t, []string{ClassText, ClassImage, ClassVideo, ClassAudio}, classes)
	plain := WithoutMedia(recs, 512)
	require.Equal(t, recs[0], plain[0])
	require.Equal(t, Record{Timestamp: 1, InputLength: 600, OutputLength: 4, HashIDs: []int64{1, 3}}, plain[1])
	require.Equal(t, Record{Timestamp: 2, InputLength: 550, OutputLength: 5, HashIDs: []int64{1, 4}}, plain[2])
	require.Equal(t, Record{Timestamp: 3, InputLength: 1150, OutputLength: 5, HashIDs: []int64{1, 6, 7}}, plain[3])
	require.Len(t, recs[2].Media, 3, "the input is not changed")
	var buf bytes.Buffer
	require.NoError(t, WriteTrace(&buf, plain))
	_, err := ReadTrace(&buf, DefaultLimits())
	require.NoError(t, err)
}
