package features

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"dataplane/native"
)

func TestMmapAllocator(t *testing.T) {
	for _, huge := range []bool{false, true} {
		a := &MmapAllocator{HugePages: huge}
		r, err := a.Map(6 << 20)
		require.NoError(t, err)
		align := uintptr(4096)
		if huge {
			align = hugePage
		}
		require.Zero(t, r.Addr%align, "%s region at %#x", a.Name(), r.Addr)
		require.Len(t, r.Host, 6<<20)
		require.Equal(t, r.Addr, uintptr(unsafe.Pointer(&r.Host[0])))
		require.Equal(t, make([]byte, 4096), r.Host[:4096], "fresh mappings are zeroed")
		for i := range r.Host {
			r.Host[i] = byte(i)
		}
		if huge {
			t.Logf("AnonHugePages of a touched 6 MiB region: %s (THP mode: %s)", smapsField(t, r.Addr, "AnonHugePages"), thpMode())
		}
		require.NoError(t, a.Unmap(r))
		require.ErrorContains(t, a.Unmap(r), "not mapped by this allocator")
	}
	_, err := (&MmapAllocator{}).Map(0)
	require.Error(t, err)
}

func thpMode() string {
	b, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	return strings.TrimSpace(string(b))
}

// smapsField reads one field of the mapping holding addr from /proc/self/smaps.
func smapsField(t *testing.T, addr uintptr, field string) string {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x", &lo, &hi); n == 2 && strings.Contains(line, " ") {
			in = lo <= addr && addr < hi
			continue
		}
		if in && strings.HasPrefix(line, field+":") {
			return strings.TrimSpace(strings.TrimPrefix(line, field+":"))
		}
	}
	return "not found"
}

// The daemon's path: encoders write features into record buffers, native.Merge writes the
// merged sequence straight into a pool view from record views, no copies in between.
func TestMergeIntoPoolViews(t *testing.T) {
	r := newRand(t)
	s := newTestStore(t, 256, 0, nil)
	const d, vocab = 64, 50
	dt := native.F16
	rowBytes := d * dt.Size()
	req, _ := s.Begin("chat-1", Policy{})

	table := make([]byte, vocab*rowBytes)
	for i := range table {
		table[i] = byte(r.IntN(256))
	}
	var spans []native.Span
	var media [][]byte
	row := 3 // 3 text tokens, a 5-row image, 2 text tokens, a 4-row image, 1 text token
	for i, rows := range []int{5, 4} {
		rec, job, err := req.Admit(context.Background(), item(fmt.Sprint("img", i), int64(rows*rowBytes)))
		require.NoError(t, err)
		b := job.Buffer().Bytes()
		for j := range b {
			b[j] = byte(r.IntN(256))
		}
		media = append(media, bytes.Clone(b))
		require.NoError(t, job.Complete(int64(rows*rowBytes)))
		v, err := rec.Host()
		require.NoError(t, err)
		require.Equal(t, v.Addr(), uintptr(unsafe.Pointer(&v.Bytes()[0])), "a view is the pool's memory")
		m, err := v.Matrix(dt, rows, d)
		require.NoError(t, err)
		spans = append(spans, native.Span{Row: row, Src: m})
		row += rows + 2
	}
	total := 3 + 5 + 2 + 4 + 1
	ids := []int32{7, 0, 49, 3, 3, 12}
	out, err := req.AllocMerged(context.Background(), false, int64(total*rowBytes))
	require.NoError(t, err)
	dst, err := out.Matrix(dt, total, d)
	require.NoError(t, err)
	_, err = out.Matrix(dt, total+1, d)
	require.Error(t, err, "a shape larger than the view")
	require.NoError(t, native.Merge(&native.MergeInput{
		Dst: dst, Table: native.Matrix{Data: table, DType: dt, Rows: vocab, Cols: d}, TextIDs: ids, Spans: spans,
	}))
	require.NoError(t, req.Merged())

	// The expected sequence, row by row.
	var want []byte
	text := func(id int32) { want = append(want, table[int(id)*rowBytes:int(id+1)*rowBytes]...) }
	text(ids[0])
	text(ids[1])
	text(ids[2])
	want = append(want, media[0]...)
	text(ids[3])
	text(ids[4])
	want = append(want, media[1]...)
	text(ids[5])
	require.Equal(t, want, out.Bytes())
	require.NoError(t, req.Prefilled())
	requireEmpty(t, s)
}
