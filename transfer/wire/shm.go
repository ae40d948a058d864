package wire

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Mapping is a FlagShm frame's payload mapped into this process: the sender's pages, read
// only, nothing copied. It stays valid until Close, even after the Conn moves on or closes.
type Mapping struct {
	f *peerFile
	b []byte
}

// Bytes is the payload.
func (m *Mapping) Bytes() []byte { return m.b }

// Close releases the payload. Closing twice is harmless.
func (m *Mapping) Close() error {
	if m.f == nil {
		return nil
	}
	f := m.f
	m.f, m.b = nil, nil
	return f.release()
}

// peerFile is one of the peer's memfds mapped whole. A sender's feature store is one or two
// memfd regions, so every frame after the first from a region finds its mapping here: no
// mmap, munmap or page faults per frame.
type peerFile struct {
	cache *fileCache
	dev   uint64
	ino   uint64
	whole []byte
	refs  int    // Mappings using it, under cache.mu
	tick  uint64 // last use, for eviction, under cache.mu
	dead  bool   // out of the cache: unmap at the last release, under cache.mu
}

func (f *peerFile) release() error {
	c := f.cache
	c.mu.Lock()
	f.refs--
	unmap := f.dead && f.refs == 0
	c.mu.Unlock()
	if unmap {
		if err := unix.Munmap(f.whole); err != nil {
			return fmt.Errorf("wire: munmap: %w", err)
		}
	}
	return nil
}

// maxPeerFiles bounds the mappings a Conn keeps: a peer store's host pool (and a spare for a
// peer that restarts and sends from a new region).
const maxPeerFiles = 4

// fileCache holds a Conn's peer mappings.
type fileCache struct {
	mu    sync.Mutex
	files []*peerFile
	tick  uint64
}

// get returns a mapping of the whole file behind fd (size bytes), holding a reference.
func (c *fileCache) get(fd int, st *unix.Stat_t) (*peerFile, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick++
	for _, f := range c.files {
		if f.dev == st.Dev && f.ino == st.Ino && int64(len(f.whole)) == st.Size {
			f.refs++
			f.tick = c.tick
			return f, nil
		}
	}
	if len(c.files) == maxPeerFiles {
		c.evict()
	}
	// The whole file, without MAP_POPULATE: populating would allocate every page of the peer's
	// pool that it never touched. Pages fault in once per mapping as frames are read.
	whole, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("wire: mmap of a %d-byte memfd: %w", st.Size, err)
	}
	f := &peerFile{cache: c, dev: st.Dev, ino: st.Ino, whole: whole, refs: 1, tick: c.tick}
	if len(c.files) < maxPeerFiles {
		c.files = append(c.files, f)
	} else {
		f.dead = true // every cached file is in use: this one lives for its frame only
	}
	return f, nil
}

// evict drops the least recently used file nobody maps now. c.mu must be held.
func (c *fileCache) evict() {
	at := -1
	for i, f := range c.files {
		if f.refs == 0 && (at < 0 || f.tick < c.files[at].tick) {
			at = i
		}
	}
	if at < 0 {
		return
	}
	f := c.files[at]
	c.files = append(c.files[:at], c.files[at+1:]...)
	unix.Munmap(f.whole)
}

// close unmaps what nobody uses; files still mapped by a Mapping go at its Close.
func (c *fileCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.files {
		f.dead = true
		if f.refs == 0 {
			unix.Munmap(f.whole)
		}
	}
	c.files = nil
}

// requiredSeals: the sender cannot shrink the memfd under our mapping (a read past its end
// would be SIGBUS, a crash of the receiver) nor remove that seal.
const requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

// MapPayload maps the current FlagShm frame's payload and checks its checksum. The descriptor
// is closed (the mapping keeps the memory). The checksum holds when it is taken: the sender
// promises not to write the bytes until the receiver answers.
//
// The peer's whole memfd is mapped (read only) and kept for later frames from it: the
// descriptor already gives access to all of it, so shared-memory frames are for daemons of one
// trust domain (one node, one operator).
func (c *Conn) MapPayload() (*Mapping, error) {
	h := &c.cur
	if !c.left || h.Flags&FlagShm == 0 {
		return nil, errors.New("wire: MapPayload: no shared-memory payload pending")
	}
	c.left = false
	fd := c.fd
	c.fd = -1
	defer unix.Close(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: frame %d: descriptor is not a sealable memfd: %v", ErrFrame, h.RequestID, err)
	}
	if seals&requiredSeals != requiredSeals {
		return nil, fmt.Errorf("%w: frame %d: memfd seals %#x lack F_SEAL_SHRINK|F_SEAL_SEAL", ErrFrame, h.RequestID, seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("wire: frame %d: fstat: %w", h.RequestID, err)
	}
	if h.ShmOffset > st.Size || h.Len > st.Size-h.ShmOffset {
		return nil, fmt.Errorf("%w: frame %d: [%d, +%d) outside a memfd of %d bytes", ErrFrame, h.RequestID, h.ShmOffset, h.Len, st.Size)
	}
	f, err := c.files.get(fd, &st)
	if err != nil {
		return nil, fmt.Errorf("wire: frame %d: %w", h.RequestID, err)
	}
	m := &Mapping{f: f, b: f.whole[h.ShmOffset : h.ShmOffset+h.Len : h.ShmOffset+h.Len]}
	if got := Checksum(m.b); got != h.Sum {
		m.Close()
		return nil, fmt.Errorf("%w: frame %d (item %q): %#016x, header says %#016x", ErrChecksum, h.RequestID, h.Key.Content, got, h.Sum)
	}
	return m, nil
}
