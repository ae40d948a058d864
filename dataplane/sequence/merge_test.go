package sequence

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native"
)

func randomMatrix(r *rand.Rand, rows, cols int, dt native.DType) native.Matrix {
	b := make([]byte, rows*cols*dt.Size())
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	if len(b) > 0 {
		b[0] |= 1
	}
	return native.Matrix{Data: b, DType: dt, Rows: rows, Cols: cols}
}

// From prompt tokens to the merged sequence, end to end: position map, then the native merge,
// against a reference that reads the single-style tokens directly (text: the table row;
// placeholder: all rows of the next item's features).
func TestMergeSequenceEndToEnd(t *testing.T) {
	r := newRand(t)
	for i := range 300 {
		c := genPrompt(r)
		dt := []native.DType{native.F32, native.F16, native.BF16}[r.IntN(3)]
		d := 1 + r.IntN(40)
		table := randomMatrix(r, textVocab, d, dt)
		features := make([]native.Matrix, len(c.items))
		for k, it := range c.items {
			features[k] = randomMatrix(r, it.Tokens, d, dt)
		}
		row := d * dt.Size()
		want := []byte{}
		next := 0
		for _, tok := range c.single {
			if c.ph.ModalityOf(tok) != 0 {
				want = append(want, features[next].Data...)
				next++
			} else {
				want = append(want, table.Data[int(tok)*row:int(tok+1)*row]...)
			}
		}
		for _, style := range styles {
			pm, err := BuildPositionMap(c.tokens(style), c.ph, style, c.items)
			require.NoError(t, err)
			dst := native.Matrix{Data: bytes.Repeat([]byte{0xa5}, pm.Len*row), DType: dt, Rows: pm.Len, Cols: d}
			require.NoError(t, Merge(dst, pm, table, features, 0))
			require.Equal(t, want, dst.Data, "case %d, %v, d=%d %v", i, style, d, dt)
		}
	}
}

func TestMergeSequenceErrors(t *testing.T) {
	r := newRand(t)
	ph := Placeholders{Image: 9, Video: NoPlaceholder, Audio: 8}
	items := []MediaItem{{ID: "cat.png", Modality: Image, Tokens: 3}, {ID: "hi.wav", Modality: Audio, Tokens: 2}}
	pm, err := BuildPositionMap([]int32{1, 9, 2, 8}, ph, PlaceholderSingle, items)
	require.NoError(t, err)
	table := randomMatrix(r, 5, 4, native.F16)
	dst := randomMatrix(r, pm.Len, 4, native.F16)
	f := func(dst native.Matrix, features []native.Matrix, want string) {
		t.Helper()
		err := Merge(dst, pm, table, features, 1)
		require.ErrorIs(t, err, ErrFeatureRows)
		require.EqualError(t, err, want)
	}
	good := []native.Matrix{randomMatrix(r, 3, 4, native.F16), randomMatrix(r, 2, 4, native.F16)}
	f(dst, good[:1], "media features do not match the position map: 1 feature buffers for 2 media items")
	f(dst, []native.Matrix{good[0], randomMatrix(r, 3, 4, native.F16)},
		`media features do not match the position map: media item 1 (audio "hi.wav") has 3 feature rows, its placeholder 2`)
	f(randomMatrix(r, 6, 4, native.F16), good, "media features do not match the position map: destination has 6 rows, the merged sequence 7")
	err = Merge(dst, pm, table, []native.Matrix{good[0], randomMatrix(r, 2, 5, native.F16)}, 1)
	require.ErrorIs(t, err, native.ErrInvalid)
	require.ErrorContains(t, err, "span 1: 5 columns, the sequence has 4")
	require.NoError(t, Merge(dst, pm, table, good, 1))
}
