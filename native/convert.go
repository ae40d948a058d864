package native

/*
#include "dp.h"
*/
import "C"

// Convert converts len(src)/srcType.Size() elements from src into dst, rounding to nearest even
// when narrowing (see dp.h for Inf and NaN). dst must hold the converted elements; src's
// length must be a whole number of elements; the two must not overlap.
func Convert(dst []byte, dstType DType, src []byte, srcType DType) error {
	return ConvertISA(dst, dstType, src, srcType, ISAAuto)
}

// ConvertISA is Convert with a chosen kernel variant (tests run every variant).
func ConvertISA(dst []byte, dstType DType, src []byte, srcType DType, isa ISA) error {
	ds, ss := dstType.Size(), srcType.Size()
	if ds == 0 || ss == 0 {
		return invalid("Convert", "unknown dtype (dst %v, src %v)", dstType, srcType)
	}
	if len(src)%ss != 0 {
		return invalid("Convert", "src holds %d bytes, not a whole number of %v elements", len(src), srcType)
	}
	n := len(src) / ss
	if len(dst) < n*ds {
		return invalid("Convert", "dst holds %d bytes, %d %v elements need %d", len(dst), n, dstType, n*ds)
	}
	var msg msgBuf
	st := C.dp_convert(dataPtr(dst), C.int32_t(dstType), dataPtr(src), C.int32_t(srcType), C.int64_t(n),
		isa.c(), msg.ptr(), msg.len())
	return errorOf("Convert", st, &msg)
}
