package features

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// MemfdAllocator maps each region from its own memfd (MAP_SHARED), so the pool's memory can
// be shared with another process on the node: the transfer layer passes the descriptor over a
// Unix socket and the peer maps the same pages (transfer/wire's shared-memory frames), with
// nothing copied. The file is sealed against shrinking and growing, so a peer that maps it
// can trust its size. Pages are faulted in on first touch, like MmapAllocator's; they count as
// shared memory (shmem) of the process.
type MemfdAllocator struct {
	mu      sync.Mutex
	regions map[uintptr]memfdRegion // region address → its file and mapping
}

type memfdRegion struct {
	fd int
	m  []byte
}

// Name says which memory this allocator hands out.
func (a *MemfdAllocator) Name() string { return "memfd" }

// Map creates a sealed memfd of size bytes and maps it shared, readable and writable.
func (a *MemfdAllocator) Map(size int64) (Region, error) {
	if size <= 0 {
		return Region{}, fmt.Errorf("features: memfd of %d bytes", size)
	}
	fd, err := unix.MemfdCreate("dataplane-features", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return Region{}, fmt.Errorf("features: memfd_create: %w", err)
	}
	fail := func(op string, err error) (Region, error) {
		unix.Close(fd)
		return Region{}, fmt.Errorf("features: memfd of %d bytes: %s: %w", size, op, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	r := hostRegion(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.regions == nil {
		a.regions = make(map[uintptr]memfdRegion)
	}
	a.regions[r.Addr] = memfdRegion{fd: fd, m: m}
	return r, nil
}

// Unmap unmaps a region and closes its memfd. A peer's mapping of it stays valid until the
// peer unmaps it.
func (a *MemfdAllocator) Unmap(r Region) error {
	a.mu.Lock()
	g, ok := a.regions[r.Addr]
	delete(a.regions, r.Addr)
	a.mu.Unlock()
	if !ok {
		return fmt.Errorf("features: unmap of %#x: not mapped by this allocator", r.Addr)
	}
	err := unix.Munmap(g.m)
	if cerr := unix.Close(g.fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("features: memfd region at %#x: %w", r.Addr, err)
	}
	return nil
}

// FD finds the memfd behind a host address from one of this allocator's regions (View.Addr):
// the descriptor and the byte offset of addr in it. The descriptor belongs to the allocator
// and is valid until the region is unmapped: send it, do not close it.
func (a *MemfdAllocator) FD(addr uintptr) (fd int, off int64, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for base, g := range a.regions { // a store has one or two regions
		if addr >= base && addr < base+uintptr(len(g.m)) {
			return g.fd, int64(addr - base), true
		}
	}
	return -1, 0, false
}
