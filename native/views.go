package native

import "unsafe"

// AsFloat32 views little-endian bytes as float32s without copying (the inverse of AsBytes). The
// slice must hold a whole number of values and be 4-byte aligned, as Go allocations are.
func AsFloat32(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
