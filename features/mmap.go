package features

import (
	"fmt"
	"sync"
	"syscall"
)

// hugePage is the x86-64 transparent huge page size.
const hugePage = 2 << 20

// MmapAllocator is the CPU backend's allocator: page-aligned memory from one private anonymous
// mapping per region. Pages are faulted in on first touch, so an unused budget costs address
// space, not memory.
//
// With HugePages, the region starts on a 2 MiB boundary and is advised MADV_HUGEPAGE, so the
// kernel backs it with 2 MiB pages where it can (transparent huge pages in "madvise" or
// "always" mode): one TLB entry covers 512 times more, which is what random row gathers from
// large buffers need (see BenchmarkGatherHugePages). Where THP is off the advice is ignored.
type MmapAllocator struct {
	HugePages bool

	mu      sync.Mutex
	mapping map[uintptr][]byte // region address → the whole mapping, for Unmap
}

// Name says which memory this allocator hands out.
func (a *MmapAllocator) Name() string {
	if a.HugePages {
		return "mmap+thp"
	}
	return "mmap"
}

// Map maps size bytes of zeroed, readable and writable memory.
func (a *MmapAllocator) Map(size int64) (Region, error) {
	if size <= 0 {
		return Region{}, fmt.Errorf("features: mmap of %d bytes", size)
	}
	pad := int64(0)
	if a.HugePages {
		pad = hugePage // room to slide the start to a 2 MiB boundary; the slack is never touched
	}
	m, err := syscall.Mmap(-1, 0, int(size+pad), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return Region{}, fmt.Errorf("features: mmap of %d bytes: %w", size+pad, err)
	}
	r := hostRegion(m[:size])
	if a.HugePages {
		skip := int64((hugePage - r.Addr%hugePage) % hugePage)
		r = hostRegion(m[skip : skip+size])
		// Advice only: a kernel without THP refuses it and the region works with small pages.
		_ = syscall.Madvise(r.Host, syscall.MADV_HUGEPAGE)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mapping == nil {
		a.mapping = make(map[uintptr][]byte)
	}
	a.mapping[r.Addr] = m
	return r, nil
}

// Unmap unmaps a region this allocator mapped.
func (a *MmapAllocator) Unmap(r Region) error {
	a.mu.Lock()
	m, ok := a.mapping[r.Addr]
	delete(a.mapping, r.Addr)
	a.mu.Unlock()
	if !ok {
		return fmt.Errorf("features: unmap of %#x: not mapped by this allocator", r.Addr)
	}
	if err := syscall.Munmap(m); err != nil {
		return fmt.Errorf("features: munmap of %d bytes at %#x: %w", len(m), r.Addr, err)
	}
	return nil
}
