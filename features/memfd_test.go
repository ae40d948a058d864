package features

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMemfdAllocator: a store on memfd regions works like one on anonymous memory, and every
// view maps back to its descriptor and offset: mapping that descriptor again (as a peer
// process would) shows the same bytes, and the file is sealed at its size.
func TestMemfdAllocator(t *testing.T) {
	a := &MemfdAllocator{}
	s, err := New(Options{Host: PoolOptions{Capacity: 4 << 20, BlockBytes: 64 << 10, Allocator: a}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req, err := s.Begin("r1", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	_, job, err := req.Admit(context.Background(), Item{Key: Key{Content: "c", Model: "m"}, MediaID: "0", Bytes: 100 << 10})
	if err != nil {
		t.Fatal(err)
	}
	b := job.Buffer().Bytes()
	for i := range b {
		b[i] = byte(i * 7)
	}
	fd, off, ok := a.FD(job.Buffer().Addr())
	if !ok || off%(64<<10) != 0 {
		t.Fatalf("FD of a pool view: %d %d %v", fd, off, ok)
	}
	if _, _, ok := a.FD(1); ok {
		t.Fatal("FD found an address outside every region")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL {
		t.Fatalf("seals %#x, %v", seals, err)
	}
	if err := unix.Ftruncate(fd, 1<<20); err == nil {
		t.Fatal("a sealed memfd shrank")
	}
	other, err := unix.Mmap(fd, 0, int(off)+len(b), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(other)
	b[4321] = 0x5a // written after the second mapping: shared pages, not a copy
	for i, x := range other[off:] {
		if x != b[i] {
			t.Fatalf("byte %d: %#x through the second mapping, %#x in the view", i, x, b[i])
		}
	}
	if err := job.Complete(int64(len(b))); err != nil {
		t.Fatal(err)
	}
	req.Cancel()
	if err := a.Unmap(Region{Addr: 1}); err == nil {
		t.Fatal("unmap of a region the allocator never mapped")
	}
}
