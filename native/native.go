// Package native holds the C11 kernels that move and convert feature bytes on the CPU (merge,
// embedding gather, fp16/bf16 conversion) and their Go bindings. The C code compiles through
// cgo with only a C compiler; CMakeLists.txt builds the same sources, with the flags below, for
// the C tests and benchmarks. Every C entry point returns a status and a message instead of
// aborting; this package turns them into *Error values.
package native

/*
#cgo CFLAGS: -std=gnu11 -O3 -Wall -Wextra
#cgo LDFLAGS: -lpthread -lturbojpeg -l:libjpeg.a -lm
// libjpeg (the crop-window decode's API, libjpeg62-turbo-dev) is linked statically: the binary
// then runs where the system libjpeg has another soname (the CUDA image's Ubuntu: libjpeg.so.8).
#include "dp.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// ABIVersion is the version of the C ABI in dp.h; the CUDA plugin must report the same.
const ABIVersion = C.DP_ABI_VERSION

// DType is the element type of a buffer.
type DType uint8

const (
	F32  DType = C.DP_F32
	F16  DType = C.DP_F16  // IEEE 754 binary16
	BF16 DType = C.DP_BF16 // bfloat16
)

// Size is the size of one element in bytes (0 for an unknown dtype): dp_dtype_size's answer
// (TestDTypeSizeIsC), in Go because it is asked several times a request and a cgo call costs
// more than the switch.
func (t DType) Size() int {
	switch t {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

// cSize is dp_dtype_size's answer, for the test that Size agrees with it.
func (t DType) cSize() int { return int(C.dp_dtype_size(C.int32_t(t))) }

func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(t))
}

// ParseDType reads the names String writes, plus the safetensors spellings (F32, F16, BF16).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "f32", "float32", "fp32":
		return F32, nil
	case "f16", "float16", "fp16", "half":
		return F16, nil
	case "bf16", "bfloat16":
		return BF16, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (want f32, f16 or bf16)", s)
}

// ISA selects a variant of the kernels. The zero value picks the best this machine runs.
type ISA uint8

const (
	ISAAuto    ISA = iota
	ISAGeneric     // portable C
	ISAAVX2        // x86-64 AVX2 + F16C
	ISAAVX512      // AVX2 plus AVX-512 F/BW/DQ/VL
)

func (i ISA) c() C.int32_t { return C.int32_t(i) - 1 }

func (i ISA) String() string {
	switch i {
	case ISAAuto:
		return "auto"
	case ISAGeneric:
		return "generic"
	case ISAAVX2:
		return "avx2"
	case ISAAVX512:
		return "avx512"
	}
	return fmt.Sprintf("isa(%d)", uint8(i))
}

// Supported reports whether this CPU and OS can run the variant.
func (i ISA) Supported() bool { return i == ISAAuto || C.dp_isa_supported(i.c()) == 1 }

// BestISA is the variant ISAAuto resolves to on this machine.
func BestISA() ISA { return ISA(C.dp_isa_best() + 1) }

// SupportedISAs lists the variants this machine runs, portable first.
func SupportedISAs() []ISA {
	var out []ISA
	for _, i := range []ISA{ISAGeneric, ISAAVX2, ISAAVX512} {
		if i.Supported() {
			out = append(out, i)
		}
	}
	return out
}

// DefaultThreads is the thread count the kernels use when a caller passes 0: the Go
// scheduler's CPU count, capped because copies stop scaling once memory bandwidth is full.
func DefaultThreads() int { return min(runtime.GOMAXPROCS(0), 8) }

// The kinds of native failure; an *Error unwraps to one of them.
var (
	ErrInvalid     = errors.New("invalid argument")
	ErrBounds      = errors.New("index out of range")
	ErrUnsupported = errors.New("not supported")
	ErrNoMem       = errors.New("out of memory")
)

// Error is a failure reported by a C entry point.
type Error struct {
	Op  string // the Go function that called into C
	Msg string // the C code's message
	err error  // one of the Err* kinds
}

func (e *Error) Error() string { return "native: " + e.Op + ": " + e.Msg }
func (e *Error) Unwrap() error { return e.err }

// msgBuf receives C error messages; it lives on the caller's stack.
type msgBuf [256]C.char

func (m *msgBuf) ptr() *C.char  { return &m[0] }
func (m *msgBuf) len() C.size_t { return C.size_t(len(m)) }

// errorOf turns a C status into nil or an *Error.
func errorOf(op string, st C.dp_status, msg *msgBuf) error {
	if st == C.DP_OK {
		return nil
	}
	kind := ErrInvalid
	switch st {
	case C.DP_ERR_BOUNDS:
		kind = ErrBounds
	case C.DP_ERR_UNSUPPORTED:
		kind = ErrUnsupported
	case C.DP_ERR_NOMEM:
		kind = ErrNoMem
	}
	return &Error{Op: op, Msg: C.GoString(msg.ptr()), err: kind}
}

// invalid is an *Error for arguments rejected on the Go side, before any C call.
func invalid(op, format string, args ...any) error {
	return &Error{Op: op, Msg: fmt.Sprintf(format, args...), err: ErrInvalid}
}

// AsBytes views a slice of numbers as its bytes, without copying.
func AsBytes[T ~float32 | ~uint16 | ~int32 | ~uint32 | ~uint8](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}

// dataPtr is the address of b's first byte, or nil for an empty slice.
func dataPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}
