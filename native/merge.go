package native

/*
#include "dp.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Matrix is a row-major [Rows, Cols] view of Data, which holds at least Rows*Cols elements of
// DType. The caller owns Data; the kernels read or write it only during the call.
type Matrix struct {
	Data  []byte
	DType DType
	Rows  int
	Cols  int
}

// Bytes is the size of the matrix's elements in bytes.
func (m Matrix) Bytes() int { return m.Rows * m.Cols * m.DType.Size() }

// check verifies the shape against Data before C sees the matrix.
func (m Matrix) check(op, what string) error {
	if m.DType.Size() == 0 {
		return invalid(op, "%s: unknown dtype %v", what, m.DType)
	}
	if m.Rows < 0 || m.Cols < 0 || (m.Cols > 0 && m.Rows > (1<<62)/m.Cols) {
		return invalid(op, "%s: bad shape [%d, %d]", what, m.Rows, m.Cols)
	}
	if len(m.Data) < m.Bytes() {
		return invalid(op, "%s: [%d, %d] %v needs %d bytes, buffer has %d", what, m.Rows, m.Cols, m.DType, m.Bytes(), len(m.Data))
	}
	return nil
}

// c returns the C view of m, pinning its memory so it may sit inside structs passed to C.
func (m Matrix) c(pin *runtime.Pinner) C.dp_matrix {
	p := dataPtr(m.Data)
	if p != nil {
		pin.Pin(p)
	}
	return C.dp_matrix{data: p, rows: C.int64_t(m.Rows), cols: C.int64_t(m.Cols), dtype: C.int32_t(m.DType)}
}

// Span places a media item's features in the merged sequence: rows [Row, Row+Src.Rows).
type Span struct {
	Row int
	Src Matrix
}

// MergeInput describes one merge. Dst is the merged [L, d] sequence (any memory the caller
// owns: a Go slice or a pool view). Spans are sorted by Row and do not overlap; every other row
// is a text row, filled in order from TextIDs by gathering rows of Table ([vocab, d]).
// Dtypes may differ: rows are converted to Dst.DType.
type MergeInput struct {
	Dst     Matrix
	Table   Matrix
	TextIDs []int32
	Spans   []Span
	Threads int // 0: DefaultThreads(); merges under 1 MiB a thread use fewer
	ISA     ISA // zero value: the best variant here
}

// Merge writes the merged sequence. It validates everything (shapes, span order, token ids
// against the table) before writing; on error Dst is untouched.
func Merge(in *MergeInput) error {
	const op = "Merge"
	if err := in.Dst.check(op, "dst"); err != nil {
		return err
	}
	if err := in.Table.check(op, "embedding table"); err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	spans := make([]C.dp_span, len(in.Spans))
	for i, s := range in.Spans {
		if err := s.Src.check(op, "span"); err != nil {
			return err
		}
		spans[i] = C.dp_span{dst_row: C.int64_t(s.Row), src: s.Src.c(&pin)}
	}
	plan := C.dp_merge_plan{
		dst:     in.Dst.c(&pin),
		table:   in.Table.c(&pin),
		n_text:  C.int64_t(len(in.TextIDs)),
		n_spans: C.int64_t(len(spans)),
	}
	if len(in.TextIDs) > 0 {
		plan.text_ids = (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(in.TextIDs)))
		pin.Pin(plan.text_ids)
	}
	if len(spans) > 0 {
		plan.spans = unsafe.SliceData(spans)
		pin.Pin(plan.spans)
	}
	var msg msgBuf
	st := C.dp_merge(&plan, C.int32_t(threads(in.Threads)), in.ISA.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// Gather writes row ids[i] of table into row i of dst (dst.Rows == len(ids)), converting the
// dtype if they differ. Every id is checked before anything is written.
func Gather(dst, table Matrix, ids []int32, threadCount int) error {
	const op = "Gather"
	if err := dst.check(op, "dst"); err != nil {
		return err
	}
	if err := table.check(op, "embedding table"); err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	d, t := dst.c(&pin), table.c(&pin)
	var msg msgBuf
	st := C.dp_gather(&d, &t, (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(ids))), C.int64_t(len(ids)),
		C.int32_t(threads(threadCount)), ISAAuto.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// CopyParallel is memcpy split over n threads: the ceiling the merge benchmarks compare with.
func CopyParallel(dst, src []byte, n int) {
	if len(src) == 0 {
		return
	}
	_ = dst[len(src)-1] // bounds check: dst must hold src
	C.dp_copy_parallel(dataPtr(dst), dataPtr(src), C.size_t(len(src)), C.int32_t(threads(n)))
}

func threads(n int) int {
	if n <= 0 {
		return DefaultThreads()
	}
	return n
}
