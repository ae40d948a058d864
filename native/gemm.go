package native

/*
#include "dp_encoder.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// PackedWeights is a weight matrix W [n, k] (PyTorch Linear layout) converted to f32 and packed
// for the GEMM kernels. It owns C memory: call Free when done.
type PackedWeights struct {
	p *C.dp_packed
}

// PackWeights converts and packs w (any float dtype).
func PackWeights(w Matrix) (*PackedWeights, error) {
	const op = "PackWeights"
	if err := w.check(op, "weights"); err != nil {
		return nil, err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	cw := w.c(&pin)
	var msg msgBuf
	var p *C.dp_packed
	if err := errorOf(op, C.dp_pack_weights(&cw, &p, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, err
	}
	return &PackedWeights{p: p}, nil
}

// Rows is n (output width), Cols is k (input width).
func (w *PackedWeights) Rows() int { return int(C.dp_packed_rows(w.p)) }
func (w *PackedWeights) Cols() int { return int(C.dp_packed_cols(w.p)) }

// Free releases the packed copy.
func (w *PackedWeights) Free() {
	C.dp_packed_free(w.p)
	w.p = nil
}

// GEMMOptions are the parts of a GEMM call past the matrices.
type GEMMOptions struct {
	Bias       []float32 // added to every row; len n, or nil
	Accumulate bool      // C += product instead of C = product
	Threads    int       // 0: DefaultThreads()
	ISA        ISA
}

// MulPacked computes C[m, n] = A[m, k] . W^T (+ bias): a is m rows of k, c m rows of n, both
// dense row-major f32.
func MulPacked(c []float32, a []float32, w *PackedWeights, opt GEMMOptions) error {
	const op = "MulPacked"
	n, k := w.Rows(), w.Cols()
	if k == 0 || len(a)%k != 0 {
		return invalid(op, "A holds %d values, not whole rows of %d", len(a), k)
	}
	m := len(a) / k
	if len(c) < m*n {
		return invalid(op, "C holds %d values, [%d, %d] needs %d", len(c), m, n, m*n)
	}
	if opt.Bias != nil && len(opt.Bias) != n {
		return invalid(op, "bias has %d values, want %d", len(opt.Bias), n)
	}
	var msg msgBuf
	st := C.dp_gemm_packed(fptr(a), C.int64_t(m), C.int64_t(k), w.p, fptr(opt.Bias), fptr(c), C.int64_t(n),
		cbool(opt.Accumulate), C.int32_t(threads(opt.Threads)), opt.ISA.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// Mul computes C[m, n] = A[m, k] . B, with B given as [k, n], or as [n, k] when transB (A . B^T).
func Mul(c, a []float32, m, k int, b []float32, n int, transB bool, opt GEMMOptions) error {
	const op = "Mul"
	if m < 0 || n < 0 || k < 0 || len(a) < m*k || len(b) < k*n || len(c) < m*n {
		return invalid(op, "buffers (A %d, B %d, C %d) too short for m=%d n=%d k=%d", len(a), len(b), len(c), m, n, k)
	}
	if opt.Bias != nil {
		return invalid(op, "bias is for MulPacked")
	}
	ldb := n
	if transB {
		ldb = k
	}
	var msg msgBuf
	st := C.dp_gemm(fptr(a), C.int64_t(m), C.int64_t(k), C.int64_t(k), fptr(b), C.int64_t(n), C.int64_t(ldb), cbool(transB),
		fptr(c), C.int64_t(n), cbool(opt.Accumulate), C.int32_t(threads(opt.Threads)), opt.ISA.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// FMAPeak runs a register-resident FMA loop of iters steps on each of n threads and returns
// the floating-point operations done; over the wall time, the machine's measured peak.
func FMAPeak(iters int64, n int, isa ISA) float64 {
	return float64(C.dp_fma_peak(C.int64_t(iters), C.int32_t(threads(n)), isa.c()))
}

func fptr(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(unsafe.SliceData(s)))
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}
