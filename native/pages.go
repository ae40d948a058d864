package native

import (
	"fmt"
	"syscall"
	"unsafe"
)

// hugePage is the x86-64 transparent huge page size.
const hugePage = 2 << 20

// Pages is memory from its own anonymous mapping, starting on a 2 MiB boundary and advised
// MADV_HUGEPAGE, so that the kernel backs it with 2 MiB pages where it can (transparent huge
// pages in "madvise" or "always" mode; elsewhere the advice is ignored and 4 KiB pages serve).
// It is for large tables read at random rows, the embedding table above all: with 4 KiB pages
// each 8 KiB row of a 256 MiB table costs TLB misses and page walks, with 2 MiB pages one TLB
// entry covers 256 rows (BenchmarkMerge's gather-32k: ~0.75x memcpy with small pages, measured
// against memcpy in the README). The daemon's table and the benchmark's come from here.
type Pages struct {
	Data    []byte // the n bytes asked for, zeroed
	mapping []byte
}

// MapPages maps n bytes. Pages are faulted in on first touch.
func MapPages(n int) (*Pages, error) {
	if n <= 0 {
		return nil, fmt.Errorf("native: MapPages of %d bytes", n)
	}
	m, err := syscall.Mmap(-1, 0, n+hugePage, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("native: mmap of %d bytes: %w", n+hugePage, err)
	}
	skip := (hugePage - int(uintptr(unsafe.Pointer(&m[0])))%hugePage) % hugePage
	p := &Pages{Data: m[skip : skip+n : skip+n], mapping: m}
	_ = syscall.Madvise(p.Data, syscall.MADV_HUGEPAGE) // advice only: refused without THP
	return p, nil
}

// Unmap releases the mapping; Data must not be used afterwards.
func (p *Pages) Unmap() error {
	if p == nil || p.mapping == nil {
		return nil
	}
	err := syscall.Munmap(p.mapping)
	p.Data, p.mapping = nil, nil
	return err
}
