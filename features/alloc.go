package features

import (
	"fmt"
	"unsafe"

	"dataplane/native"
)

// Allocator supplies the one large region a pool carves. The CPU backend maps anonymous
// memory (MmapAllocator); the CUDA plugin will supply pinned host memory (cudaHostAlloc) and
// device memory through the same interface. Allocation is slow and happens once per pool.
type Allocator interface {
	// Map returns a region of exactly size bytes, aligned to at least 4 KiB.
	Map(size int64) (Region, error)
	// Unmap gives a region from Map back. Nothing may use its memory afterwards.
	Unmap(Region) error
	// Name says what memory this is, for logs and errors ("mmap", "mmap+thp", "cuda-pinned").
	Name() string
}

// Region is a span of memory from an Allocator.
type Region struct {
	Addr uintptr // first byte: a host address, or a device address for device memory
	Size int64
	// Host is the region as Go bytes when the CPU can address it (host and pinned memory);
	// nil for device memory, which only the plugin touches.
	Host []byte
}

// View is a buffer the store handed out: Len bytes at Off within a pool's region. Views are
// plain values; copying one copies no bytes. A view is valid until the owner releases what it
// came from (the record, the merged sequence); afterwards its memory belongs to someone else.
type View struct {
	region *Region
	off    int64
	n      int64
}

// Len is the view's size in bytes.
func (v View) Len() int64 { return v.n }

// Addr is the address of the first byte (host or device), for the CUDA plugin and the
// transfer layer.
func (v View) Addr() uintptr {
	if v.region == nil {
		return 0
	}
	return v.region.Addr + uintptr(v.off)
}

// Bytes is the view as a byte slice of length and capacity Len, sharing the pool's memory,
// or nil for device memory. Writes through it land in the pool: this is how the encoder fills
// a record and how native.Merge writes a merged sequence without a copy.
func (v View) Bytes() []byte {
	if v.region == nil || v.region.Host == nil {
		return nil
	}
	return v.region.Host[v.off : v.off+v.n : v.off+v.n]
}

// Matrix presents the view as a row-major [rows, cols] matrix for the native kernels. It
// fails when the view is device memory or too small for the shape.
func (v View) Matrix(dt native.DType, rows, cols int) (native.Matrix, error) {
	b := v.Bytes()
	if b == nil {
		return native.Matrix{}, fmt.Errorf("features: view of %d bytes is not host memory", v.n)
	}
	if rows < 0 || cols < 0 || dt.Size() == 0 || int64(rows)*int64(cols)*int64(dt.Size()) > v.n {
		return native.Matrix{}, fmt.Errorf("features: [%d, %d] %v does not fit a view of %d bytes", rows, cols, dt, v.n)
	}
	return native.Matrix{Data: b, DType: dt, Rows: rows, Cols: cols}, nil
}

// hostRegion makes a Region from memory the CPU can address.
func hostRegion(b []byte) Region {
	return Region{Addr: uintptr(unsafe.Pointer(unsafe.SliceData(b))), Size: int64(len(b)), Host: b}
}
