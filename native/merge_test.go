package native

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

var allDTypes = []DType{F32, F16, BF16}

// refMerge is the naive reference: one row at a time, one element at a time.
func refMerge(in *MergeInput) []byte {
	d, ds := in.Dst.Cols, in.Dst.DType.Size()
	out := make([]byte, in.Dst.Rows*d*ds)
	t, k := 0, 0
	for r := range in.Dst.Rows {
		for k < len(in.Spans) && in.Spans[k].Row+in.Spans[k].Src.Rows <= r {
			k++
		}
		var src []byte
		var st DType
		if k < len(in.Spans) && r >= in.Spans[k].Row {
			s := in.Spans[k]
			st = s.Src.DType
			src = s.Src.Data[(r-s.Row)*d*st.Size():]
		} else {
			st = in.Table.DType
			src = in.Table.Data[int(in.TextIDs[t])*d*st.Size():]
			t++
		}
		refConvertAll(out[r*d*ds:(r+1)*d*ds], in.Dst.DType, src[:d*st.Size()], st)
	}
	return out
}

// newMatrix is a [rows, cols] matrix of random bytes (never all zeros).
func newMatrix(r *rand.Rand, rows, cols int, dt DType) Matrix {
	return Matrix{Data: randomBytes(r, rows*cols*dt.Size()), DType: dt, Rows: rows, Cols: cols}
}

// buildMerge lays out a merged sequence from segments: n > 0 is a run of n text tokens, n < 0
// a media span of -n rows. Media dtypes cycle through mediaTypes.
func buildMerge(r *rand.Rand, segments []int, d, vocab int, table DType, mediaTypes []DType, dst DType) *MergeInput {
	in := &MergeInput{Table: newMatrix(r, vocab, d, table)}
	row := 0
	for _, n := range segments {
		if n > 0 {
			for range n {
				in.TextIDs = append(in.TextIDs, int32(r.IntN(vocab)))
			}
			row += n
			continue
		}
		mt := mediaTypes[len(in.Spans)%len(mediaTypes)]
		in.Spans = append(in.Spans, Span{Row: row, Src: newMatrix(r, -n, d, mt)})
		row += -n
	}
	in.Dst = Matrix{Data: make([]byte, row*d*dst.Size()), DType: dst, Rows: row, Cols: d}
	return in
}

// checkMerge runs the merge twice over two different poisons: each run must equal the
// reference, so every element was written (a stale poison cannot match both times).
func checkMerge(t *testing.T, in *MergeInput, what string) {
	t.Helper()
	want := refMerge(in)
	for _, poison := range []byte{0xa5, 0x5a} {
		for i := range in.Dst.Data {
			in.Dst.Data[i] = poison
		}
		require.NoError(t, Merge(in), what)
		if !bytes.Equal(want, in.Dst.Data[:len(want)]) {
			t.Fatalf("%s: merged sequence differs from the reference (poison %#x) at byte %d", what, poison, firstDiff(want, in.Dst.Data))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

var layouts = map[string][]int{
	"text only":      {12},
	"one token":      {1},
	"empty":          {},
	"media at start": {-7, 9},
	"media at end":   {9, -7},
	"media between":  {4, -6, 5},
	"adjacent media": {3, -4, -5, 2},
	"media only":     {-6},
	"adjacent only":  {-3, -1, -3},
	"many":           {2, -3, 1, -1, 5, -2, -2, 3, -4, 1},
}

// Every layout, every dtype of table, media and destination, every kernel variant.
func TestMergeAgainstReference(t *testing.T) {
	r := newRand(t)
	forEachISA(t, func(t *testing.T, isa ISA) {
		for name, layout := range layouts {
			for _, table := range allDTypes {
				for _, media := range allDTypes {
					for _, dst := range allDTypes {
						d := []int{1, 3, 8, 17, 64}[r.IntN(5)]
						in := buildMerge(r, layout, d, 50, table, []DType{media, table}, dst)
						in.ISA = isa
						checkMerge(t, in, fmt.Sprintf("%s d=%d table=%v media=%v dst=%v", name, d, table, media, dst))
					}
				}
			}
		}
	})
}

// randomLayout is a random mix of text runs and media spans, rows in total.
func randomLayout(r *rand.Rand, rows int) []int {
	var seg []int
	for left := rows; left > 0; {
		n := 1 + r.IntN(min(left, rows/8+1))
		if r.IntN(2) == 0 {
			n = -n
		}
		seg = append(seg, n)
		left -= max(n, -n)
	}
	return seg
}

// Large enough for several threads (the kernel gives each at least 1 MiB), so thread
// boundaries fall inside text runs and spans. The destination is f32 so every row is a copy
// or a widening, which the reference does quickly; narrowing is the same code with one thread.
func TestMergeThreaded(t *testing.T) {
	r := newRand(t)
	for _, threads := range []int{2, 3, 4, 7} {
		layout := randomLayout(r, 4096)
		in := buildMerge(r, layout, 512, 1000, F16, []DType{F32, F16, BF16}, F32)
		in.Threads = threads
		checkMerge(t, in, fmt.Sprintf("threads=%d, %d segments", threads, len(layout)))
	}
}

// A failed merge names the problem and leaves the destination untouched.
func TestMergeErrors(t *testing.T) {
	r := newRand(t)
	f := func(kind error, want string, mutate func(in *MergeInput)) {
		t.Helper()
		in := buildMerge(r, []int{3, -2, 4, -3, 1}, 4, 10, F16, []DType{F16}, F16)
		mutate(in)
		poison := bytes.Repeat([]byte{0xa5}, len(in.Dst.Data))
		copy(in.Dst.Data, poison)
		err := Merge(in)
		require.ErrorIs(t, err, kind)
		require.ErrorContains(t, err, want)
		require.Equal(t, poison, in.Dst.Data, "dst written by a failed merge")
	}
	f(ErrBounds, "text token 4 (row 6): id 10 outside the embedding table's 10 rows", func(in *MergeInput) { in.TextIDs[4] = 10 })
	f(ErrBounds, "text token 0 (row 0): id -1", func(in *MergeInput) { in.TextIDs[0] = -1 })
	f(ErrInvalid, "span 1: starts at row 4, before the end (5)", func(in *MergeInput) { in.Spans[1].Row = 4 })
	f(ErrInvalid, "span 1: starts at row 3, before the end (12)", func(in *MergeInput) { in.Spans[0], in.Spans[1] = in.Spans[1], in.Spans[0] })
	f(ErrBounds, "span 0: starts at row -1", func(in *MergeInput) { in.Spans[0].Row = -1 })
	f(ErrBounds, "span 1: rows [11, 14) outside the sequence's 13 rows", func(in *MergeInput) { in.Spans[1].Row = 11 })
	f(ErrInvalid, "7 text ids + 5 media rows != 13 rows", func(in *MergeInput) { in.TextIDs = in.TextIDs[:7] })
	f(ErrInvalid, "span 0: 3 columns, the sequence has 4", func(in *MergeInput) {
		in.Spans[0].Src = Matrix{Data: in.Spans[0].Src.Data, DType: F16, Rows: 2, Cols: 3}
	})
	f(ErrInvalid, "embedding table: 2 columns", func(in *MergeInput) { in.Table.Cols = 2 })
	f(ErrInvalid, "span: [3, 4] f16 needs 24 bytes, buffer has 16", func(in *MergeInput) { in.Spans[1].Src.Data = in.Spans[1].Src.Data[:16] })
	f(ErrInvalid, "dst: unknown dtype dtype(5)", func(in *MergeInput) { in.Dst.DType = 5 })
	f(ErrInvalid, "dst: bad shape [-1, 4]", func(in *MergeInput) { in.Dst.Rows = -1 })
	f(ErrUnsupported, "not supported", func(in *MergeInput) { in.ISA = 9 })
}

func TestGather(t *testing.T) {
	r := newRand(t)
	for _, table := range allDTypes {
		for _, dst := range allDTypes {
			in := buildMerge(r, []int{37}, 24, 100, table, []DType{table}, dst)
			want := refMerge(in)
			require.NoError(t, Gather(in.Dst, in.Table, in.TextIDs, 0))
			require.Equal(t, want, in.Dst.Data, "table %v dst %v", table, dst)
		}
	}
	in := buildMerge(r, []int{5}, 4, 10, F32, []DType{F32}, F32)
	in.TextIDs[3] = 12
	require.ErrorContains(t, Gather(in.Dst, in.Table, in.TextIDs, 1), "text token 3 (row 3): id 12 outside")
	require.ErrorContains(t, Gather(in.Dst, in.Table, in.TextIDs[:4], 1), "4 ids for 5 dst rows")
}

// A destination of 16 MiB or more is written with streaming stores (text rows and a span, one
// and two threads; text rows go in pairs, and an odd run ends with one), from a table in MapPages
// memory as the daemon's is.
func TestMergeLargeStreams(t *testing.T) {
	r := newRand(t)
	const d, vocab = 1024, 300
	pages, err := MapPages(vocab * d * 2)
	require.NoError(t, err)
	defer func() { require.NoError(t, pages.Unmap()) }()
	copy(pages.Data, randomBytes(r, len(pages.Data)))
	in := buildMerge(r, []int{5001, -7, 3201}, d, vocab, F16, []DType{F16}, F16) // odd runs: a row pair and a single row
	in.Table = Matrix{Data: pages.Data, DType: F16, Rows: vocab, Cols: d}
	require.GreaterOrEqual(t, len(in.Dst.Data), 16<<20)
	want := refMerge(in)
	for _, threads := range []int{1, 2} { // the best variant: streaming needs AVX2 or wider
		clear(in.Dst.Data)
		in.Threads = threads
		require.NoError(t, Merge(in))
		require.True(t, bytes.Equal(want, in.Dst.Data), "threads=%d: differs at byte %d", threads, firstDiff(want, in.Dst.Data))
	}
}

func TestCopyParallel(t *testing.T) {
	r := newRand(t)
	for _, n := range []int{0, 1, 4095, 4097, 3<<20 + 17} {
		src := randomBytes(r, n)
		dst := make([]byte, n+1)
		CopyParallel(dst, src, 3)
		require.Equal(t, src, dst[:n])
		require.Zero(t, dst[n])
	}
}

// The fuzzer builds plans, valid or not, from its input: a merge either succeeds and equals the
// reference, or fails and leaves dst untouched. It must never crash or write out of bounds.
func FuzzMerge(f *testing.F) {
	f.Add([]byte{4, 10, 0, 1, 2, 3, 0x83, 2, 0x81, 0})
	f.Add([]byte{1, 1, 2, 2, 2, 0x90, 0x7f, 5, 3})
	f.Add([]byte{8, 0, 1, 0, 1, 0x84, 0x84, 0x84})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		d := 1 + next()%8
		vocab := next() % 16
		r := rand.New(rand.NewPCG(uint64(len(data)), 1))
		in := &MergeInput{Table: newMatrix(r, vocab, d, allDTypes[next()%3])}
		dst := allDTypes[next()%3]
		row := 0
		for len(data) > 0 {
			b := next()
			switch {
			case b&0x80 != 0: // a span; bit 6 shifts its start to overlap or leave gaps
				start := row
				if b&0x40 != 0 {
					start += next()%5 - 2
				}
				rows := b & 0x0f
				in.Spans = append(in.Spans, Span{Row: start, Src: newMatrix(r, rows, d, allDTypes[(b>>4)%3])})
				row = max(row, start+rows)
			default: // a text token; ids past vocab are out of range on purpose
				in.TextIDs = append(in.TextIDs, int32(b)-2)
				row++
			}
		}
		rows := row + (len(in.TextIDs)%3 - 1) // sometimes one row too many or too few
		if rows < 0 {
			rows = 0
		}
		in.Dst = Matrix{Data: make([]byte, rows*d*dst.Size()), DType: dst, Rows: rows, Cols: d}
		for i := range in.Dst.Data {
			in.Dst.Data[i] = 0xa5
		}
		if err := Merge(in); err != nil {
			for _, b := range in.Dst.Data {
				if b != 0xa5 {
					t.Fatalf("failed merge (%v) wrote dst", err)
				}
			}
			return
		}
		if want := refMerge(in); !bytes.Equal(want, in.Dst.Data) {
			t.Fatalf("merge differs from the reference at byte %d", firstDiff(want, in.Dst.Data))
		}
	})
}
