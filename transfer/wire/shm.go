package wire

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Mapping is a FlagShm frame's payload mapped into this process: the sender's pages, read
// only, nothing copied. It stays valid until Close, even after the Conn moves on.
type Mapping struct {
	whole []byte // the page-aligned mapping, for munmap
	b     []byte
}

// Bytes is the payload.
func (m *Mapping) Bytes() []byte { return m.b }

// Close unmaps the payload.
func (m *Mapping) Close() error {
	if m.whole == nil {
		return nil
	}
	err := unix.Munmap(m.whole)
	m.whole, m.b = nil, nil
	if err != nil {
		return fmt.Errorf("wire: munmap: %w", err)
	}
	return nil
}

// requiredSeals: the sender cannot shrink the memfd under our mapping (a read past its end
// would be SIGBUS, a crash of the receiver) nor remove that seal.
const requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

// MapPayload maps the current FlagShm frame's payload and checks its checksum. The descriptor
// is closed once mapped (the mapping keeps the memory). The checksum holds when it is taken:
// the sender promises not to write the bytes until the receiver answers.
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
	page := int64(unix.Getpagesize())
	start := h.ShmOffset &^ (page - 1)
	skip := h.ShmOffset - start
	whole, err := unix.Mmap(fd, start, int(skip+h.Len), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("wire: frame %d: mmap of %d bytes: %w", h.RequestID, skip+h.Len, err)
	}
	m := &Mapping{whole: whole, b: whole[skip : skip+h.Len : skip+h.Len]}
	if got := Checksum(m.b); got != h.Sum {
		m.Close()
		return nil, fmt.Errorf("%w: frame %d (item %q): %#016x, header says %#016x", ErrChecksum, h.RequestID, h.Key.Content, got, h.Sum)
	}
	return m, nil
}
