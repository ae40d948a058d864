package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"dataplane/features"
)

// Options are a connection's limits. The zero value means the defaults.
type Options struct {
	// MaxPayload refuses frames that declare a larger payload, before reading them
	// (default DefaultMaxPayload).
	MaxPayload int64
	// WriteTimeout bounds one Send, the whole frame, when its context has no earlier deadline
	// (default 30 s): a peer that stops reading cannot hold a sender forever. 30 s carries
	// 1 GiB at 300 Mb/s; set it by the link for larger frames on slower links.
	WriteTimeout time.Duration
	// ReadTimeout bounds the rest of a header once it has started to arrive, and then a whole
	// payload, when the context has no earlier deadline (default 30 s). Waiting for the next
	// header is bounded by the context alone, so an idle connection may stay open.
	ReadTimeout time.Duration
	// Compress is the codec Send uses for payloads of 4 KiB and more (default none; the
	// receiver needs no option). A frame that does not shrink goes raw. It pays only on links
	// slower than the compressing cores: see the README's rule before turning it on.
	Compress Compress
}

// Defaults for Options' zero fields.
const (
	DefaultWriteTimeout = 30 * time.Second
	DefaultReadTimeout  = 30 * time.Second
)

func (o Options) withDefaults() Options {
	if o.MaxPayload <= 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	return o
}

// Conn sends and receives frames over one stream connection (TCP or Unix). Sends may come from
// many goroutines (a frame is written whole under a lock); receiving is one goroutine's job:
// Next, then ReadPayload, MapPayload or Discard for that frame's payload (Next discards a
// payload nobody read).
//
// A failed read or write leaves the stream at an unknown position, so it breaks the Conn: every
// later call returns that error, and the owner closes it. A checksum mismatch does not: the
// whole payload was read, the next frame can follow.
type Conn struct {
	nc   net.Conn
	uc   *net.UnixConn // nc as a Unix socket: descriptors can travel (shm); nil for TCP
	opts Options

	wmu    sync.Mutex
	wbuf   []byte // the encoded header, under wmu
	wbroke error  // under wmu

	// Receive side: one goroutine.
	rfixed [HeaderSize]byte
	rmeta  [MaxMeta]byte
	roob   []byte
	cur    Header // the frame whose payload is pending
	left   bool   // cur's payload has not been consumed
	fd     int    // the memfd of a FlagShm frame, -1 when none is held
	files  fileCache
	rbroke error
}

// NewConn wraps an established connection. Conn takes it over: Close closes it.
func NewConn(nc net.Conn, opts Options) *Conn {
	c := &Conn{nc: nc, opts: opts.withDefaults(), fd: -1}
	c.uc, _ = nc.(*net.UnixConn)
	if c.uc != nil {
		c.roob = make([]byte, unix.CmsgSpace(4*4)) // room for a few descriptors, to close extras
	}
	return c
}

// Net is the underlying connection (addresses, tests).
func (c *Conn) Net() net.Conn { return c.nc }

// Close closes the connection and any descriptor received and not yet mapped.
func (c *Conn) Close() error {
	c.dropFD()
	c.files.close()
	return c.nc.Close()
}

// deadline is ctx's deadline if it is earlier than now+d.
func deadline(ctx context.Context, d time.Duration) time.Time {
	t := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(t) {
		return dl
	}
	return t
}

// interrupt makes a blocked read or write return when ctx ends; call the result when done.
func interrupt(ctx context.Context, set func(time.Time) error) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = set(time.Unix(1, 0)) })
}

// ioErr names ctx's error when ctx ended the operation.
func ioErr(ctx context.Context, op string, err error) error {
	cerr := ctx.Err()
	if cerr == nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// The socket deadline was the context's and fired a moment before its timer.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			cerr = context.DeadlineExceeded
		}
	}
	if cerr != nil {
		return fmt.Errorf("wire: %s: %w (%v)", op, cerr, err)
	}
	return fmt.Errorf("wire: %s: %w", op, err)
}

// Send writes one frame: h (Kind, RequestID, Key, DType, Rows, Cols, Text) and payload, with
// one writev and no copy of the payload. Len is set from payload. Sum is computed here when
// h.Sum is 0; a caller that computed Checksum(payload) earlier (once, when the encoder
// finished and the bytes were still in the cache) passes it and saves a pass over the payload
// on every send (BenchmarkTransfer's presum rows).
//
// With Options.Compress, the payload is compressed first (2-byte dtypes byte-shuffled) into
// scratch held only until the frame is written; Sum stays the checksum of payload itself.
func (c *Conn) Send(ctx context.Context, h Header, payload []byte) error {
	h.Flags &^= FlagShm | FlagShmReply | FlagInPlace | flagsZip
	h.ShmOffset, h.ShmLen, h.CompressedLen = 0, 0, 0
	h.Len = int64(len(payload))
	if h.Sum == 0 {
		h.Sum = Checksum(payload)
	}
	if h.Kind != KindError && h.Len <= c.opts.MaxPayload {
		// Outside the write lock: concurrent senders compress on their own cores.
		if z, flag, bufs, ok := compress(c.opts.Compress, h.DType, payload); ok {
			defer scratch.put(bufs...)
			h.Flags |= flag
			h.CompressedLen = int64(len(z))
			payload = z
		}
	}
	return c.write(ctx, &h, payload, -1)
}

// SendError tells the peer that request id (item key) failed, and why.
func (c *Conn) SendError(ctx context.Context, id uint64, key features.Key, msg string) error {
	if len(msg) > MaxText {
		msg = msg[:MaxText]
	}
	return c.Send(ctx, Header{Kind: KindError, RequestID: id, Key: key, Text: msg}, nil)
}

// SendShm sends a frame whose payload stays in shared memory: payload must be this process's
// mapping of bytes [off, off+len(payload)) of the memfd fd (a MemfdAllocator region, or any
// memfd sealed against shrinking). Sum as for Send. The descriptor travels with the header (SCM_RIGHTS); the
// peer maps the same pages. The sender must not change those bytes until the peer says it is
// done with them (its reply to the request).
func (c *Conn) SendShm(ctx context.Context, h Header, payload []byte, fd int, off int64) error {
	if c.uc == nil {
		return errors.New("wire: shared-memory frames need a Unix socket")
	}
	if len(payload) == 0 || fd < 0 || off < 0 {
		return fmt.Errorf("wire: shared-memory frame of %d bytes, fd %d, offset %d", len(payload), fd, off)
	}
	h.Flags = h.Flags&^(FlagShmReply|FlagInPlace|flagsZip) | FlagShm
	h.ShmOffset, h.ShmLen, h.CompressedLen = off, int64(len(payload)), 0
	h.Len = int64(len(payload))
	if h.Sum == 0 {
		h.Sum = Checksum(payload)
	}
	return c.write(ctx, &h, nil, fd)
}

// SendWithReply sends a request (payload in the stream, as Send) that names where its answer
// goes: bytes [off, off+n) of the memfd fd, this process's memory (a features.Job's buffer in a
// store on a MemfdAllocator). The peer writes the answer there (MapReply) and says so with
// SendInPlace: the answer lands in the requester's budget with nothing copied. Same node only.
func (c *Conn) SendWithReply(ctx context.Context, h Header, payload []byte, fd int, off, n int64) error {
	if c.uc == nil {
		return errors.New("wire: shared-memory replies need a Unix socket")
	}
	if n <= 0 || fd < 0 || off < 0 {
		return fmt.Errorf("wire: reply range of %d bytes, fd %d, offset %d", n, fd, off)
	}
	h.Flags = h.Flags&^(FlagShm|FlagInPlace|flagsZip) | FlagShmReply
	h.ShmOffset, h.ShmLen, h.CompressedLen = off, n, 0
	h.Len = int64(len(payload))
	if h.Sum == 0 {
		h.Sum = Checksum(payload)
	}
	return c.write(ctx, &h, payload, fd)
}

// SendInPlace answers a FlagShmReply request whose answer was written into the range it named
// (MapReply): written is that mapping's first bytes. Only the header travels.
func (c *Conn) SendInPlace(ctx context.Context, h Header, written []byte) error {
	if len(written) == 0 {
		return errors.New("wire: an in-place answer of no bytes")
	}
	h.Flags = h.Flags&^(FlagShm|FlagShmReply|flagsZip) | FlagInPlace
	h.ShmOffset, h.ShmLen, h.CompressedLen = 0, 0, 0
	h.Len = int64(len(written))
	if h.Sum == 0 {
		h.Sum = Checksum(written)
	}
	return c.write(ctx, &h, nil, -1)
}

func (c *Conn) write(ctx context.Context, h *Header, payload []byte, fd int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wbroke != nil {
		return c.wbroke
	}
	var err error
	c.wbuf, err = AppendHeader(c.wbuf[:0], h, c.opts.MaxPayload)
	if err != nil {
		return err // nothing written: the stream is intact
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.nc.SetWriteDeadline(deadline(ctx, c.opts.WriteTimeout)); err != nil {
		return fmt.Errorf("wire: write deadline: %w", err)
	}
	stop := interrupt(ctx, c.nc.SetWriteDeadline)
	defer stop()
	if fd >= 0 {
		// The descriptor rides on the header's bytes; a payload follows in the stream.
		if err = c.writeRights(c.wbuf, fd); err == nil && len(payload) > 0 {
			_, err = c.nc.Write(payload)
		}
	} else {
		// net.Buffers is writev on TCP and Unix connections: header and payload leave in one
		// system call, straight from the caller's memory.
		bufs := net.Buffers{c.wbuf, payload}
		_, err = bufs.WriteTo(c.nc)
	}
	if err != nil {
		c.wbroke = ioErr(ctx, fmt.Sprintf("send %v frame %d", h.Kind, h.RequestID), err)
		return c.wbroke
	}
	return nil
}

// writeRights writes b with fd attached to its first byte.
func (c *Conn) writeRights(b []byte, fd int) error {
	n, _, err := c.uc.WriteMsgUnix(b, unix.UnixRights(fd), nil)
	if err != nil {
		return err
	}
	if n < len(b) { // a short write: the rest without the descriptor
		_, err = c.nc.Write(b[n:])
	}
	return err
}

// Next reads the next frame's header. Waiting for it is bounded only by ctx (an idle peer is
// not an error); once it has started, the rest must arrive within ReadTimeout. A payload of the
// previous frame that nobody consumed is discarded first. A KindError frame comes back as a
// header like any other: h.Err() turns it into a *RemoteError.
func (c *Conn) Next(ctx context.Context) (Header, error) {
	if c.left {
		if err := c.Discard(ctx); err != nil {
			return Header{}, err
		}
	}
	if c.rbroke != nil {
		return Header{}, c.rbroke
	}
	c.dropFD() // a reply range nobody mapped
	if err := ctx.Err(); err != nil {
		return Header{}, err
	}
	h, err := c.readHeader(ctx)
	if err != nil {
		// Past a bad or oversized header the stream cannot be followed (skipping a declared
		// terabyte is no option): the Conn is done.
		c.dropFD()
		c.rbroke = err
		return Header{}, err
	}
	c.cur, c.left = h, h.Flags&FlagShm != 0 || h.streamLen() > 0
	return h, nil
}

func (c *Conn) readHeader(ctx context.Context) (Header, error) {
	dl := time.Time{}
	if d, ok := ctx.Deadline(); ok {
		dl = d
	}
	if err := c.nc.SetReadDeadline(dl); err != nil {
		return Header{}, fmt.Errorf("wire: read deadline: %w", err)
	}
	stop := interrupt(ctx, c.nc.SetReadDeadline)
	defer stop()
	first, err := c.readFixed(ctx)
	if err != nil {
		if first == 0 && errors.Is(err, io.EOF) {
			return Header{}, io.EOF // a clean close between frames
		}
		return Header{}, ioErr(ctx, "read header", err)
	}
	var h Header
	metaLen, err := parseFixed(c.rfixed[:], &h, c.opts.MaxPayload)
	if err != nil {
		return h, err
	}
	if err := c.nc.SetReadDeadline(deadline(ctx, c.opts.ReadTimeout)); err != nil {
		return Header{}, fmt.Errorf("wire: read deadline: %w", err)
	}
	meta := c.rmeta[:metaLen]
	if _, err := io.ReadFull(c.nc, meta); err != nil {
		return Header{}, ioErr(ctx, fmt.Sprintf("read metadata of frame %d", h.RequestID), unexpected(err))
	}
	if err := parseMeta(c.rfixed[:], meta, &h, c.opts.MaxPayload); err != nil {
		return h, err
	}
	if h.Flags&(FlagShm|FlagShmReply) != 0 {
		if c.fd < 0 {
			return h, frameErr("shared-memory frame %d came without a descriptor", h.RequestID)
		}
	} else if c.fd >= 0 {
		return h, frameErr("frame %d carried a descriptor it does not use", h.RequestID)
	}
	return h, nil
}

// readFixed fills rfixed. On a Unix socket it reads with recvmsg to collect a descriptor sent
// with the header; a frame may carry at most one.
func (c *Conn) readFixed(ctx context.Context) (int, error) {
	if c.uc == nil {
		n, err := c.nc.Read(c.rfixed[:])
		if err != nil || n == HeaderSize {
			if n > 0 && n < HeaderSize {
				err = unexpected(err)
			}
			return n, err
		}
		// The header started: the rest is bounded by ReadTimeout.
		if err := c.nc.SetReadDeadline(deadline(ctx, c.opts.ReadTimeout)); err != nil {
			return n, err
		}
		m, err := io.ReadFull(c.nc, c.rfixed[n:])
		return n + m, unexpected(err)
	}
	n := 0
	for n < HeaderSize {
		m, oobn, flags, _, err := c.uc.ReadMsgUnix(c.rfixed[n:], c.roob)
		if oobn > 0 {
			if ferr := c.takeRights(c.roob[:oobn], flags); ferr != nil {
				return n + m, ferr
			}
		}
		n += m
		if err != nil {
			if n > 0 {
				err = unexpected(err)
			}
			return n, err
		}
		if m == 0 {
			return n, io.ErrUnexpectedEOF
		}
		if n == m && n < HeaderSize {
			// The header started: the rest is bounded by ReadTimeout.
			if err := c.nc.SetReadDeadline(deadline(ctx, c.opts.ReadTimeout)); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// takeRights keeps the one descriptor a frame may carry and closes any other.
func (c *Conn) takeRights(oob []byte, flags int) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return frameErr("control message: %v", err)
	}
	var extra int
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue // not SCM_RIGHTS (credentials): ignored
		}
		for _, fd := range fds {
			if c.fd < 0 {
				c.fd = fd
			} else {
				unix.Close(fd)
				extra++
			}
		}
	}
	if flags&unix.MSG_CTRUNC != 0 || extra > 0 {
		return frameErr("more than one descriptor with a frame")
	}
	return nil
}

func (c *Conn) dropFD() {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readChunk is how much payload is read before it is hashed: small enough to still be in
// the cache when the checksum reads it.
const readChunk = 256 << 10

// ReadPayload reads the current frame's payload into dst[:h.Len] (dst must be at least that
// long) and checks it against the header's checksum (ErrChecksum; the stream stays in sync).
// For a FlagShm frame it copies from the mapping (one copy: use MapPayload for none).
func (c *Conn) ReadPayload(ctx context.Context, dst []byte) error {
	h := &c.cur
	if !c.left {
		return errors.New("wire: ReadPayload: no payload pending")
	}
	if int64(len(dst)) < h.Len {
		return fmt.Errorf("wire: ReadPayload: buffer of %d bytes for a payload of %d", len(dst), h.Len)
	}
	dst = dst[:h.Len]
	if h.Flags&FlagShm != 0 {
		m, err := c.MapPayload()
		if err != nil {
			return err
		}
		copy(dst, m.Bytes())
		return m.Close()
	}
	c.left = false
	if err := c.nc.SetReadDeadline(deadline(ctx, c.opts.ReadTimeout)); err != nil {
		c.rbroke = fmt.Errorf("wire: read deadline: %w", err)
		return c.rbroke
	}
	stop := interrupt(ctx, c.nc.SetReadDeadline)
	defer stop()
	if h.Flags&flagsZip != 0 {
		return c.readCompressed(ctx, dst)
	}
	sum := xxh3.New()
	for off := 0; off < len(dst); {
		// Whatever the socket has (up to readChunk) per read, hashed at once while it is still
		// in the cache.
		n, err := c.nc.Read(dst[off:min(off+readChunk, len(dst))])
		sum.Write(dst[off : off+n])
		off += n
		if err != nil && off < len(dst) {
			c.rbroke = ioErr(ctx, fmt.Sprintf("read payload of frame %d (%d of %d bytes)", h.RequestID, off, h.Len), unexpected(err))
			return c.rbroke
		}
	}
	if got := sum.Sum64(); got != h.Sum {
		return fmt.Errorf("%w: frame %d (item %q): %#016x, header says %#016x", ErrChecksum, h.RequestID, h.Key.Content, got, h.Sum)
	}
	return nil
}

// readCompressed reads a compressed payload whole into scratch (CompressedLen < Len, which
// the header check guarantees, so no more than the payload the caller made room for), then
// decompresses it into dst. A payload that does not decompress to Len bytes, or not to its
// checksum, is ErrChecksum: its bytes were all read, the stream stays in sync.
func (c *Conn) readCompressed(ctx context.Context, dst []byte) error {
	h := &c.cur
	z := scratch.get(int(h.CompressedLen))
	defer scratch.put(z)
	if _, err := io.ReadFull(c.nc, z); err != nil {
		c.rbroke = ioErr(ctx, fmt.Sprintf("read compressed payload of frame %d (%d bytes)", h.RequestID, h.CompressedLen), unexpected(err))
		return c.rbroke
	}
	return decompress(h, z, dst)
}

// Discard skips the current frame's payload (an item the receiver refused or already has).
func (c *Conn) Discard(ctx context.Context) error {
	if !c.left {
		return nil
	}
	c.left = false
	if c.cur.Flags&FlagShm != 0 {
		c.dropFD()
		return nil
	}
	if err := c.nc.SetReadDeadline(deadline(ctx, c.opts.ReadTimeout)); err != nil {
		c.rbroke = fmt.Errorf("wire: read deadline: %w", err)
		return c.rbroke
	}
	stop := interrupt(ctx, c.nc.SetReadDeadline)
	defer stop()
	bp := discardBufs.Get().(*[]byte)
	defer discardBufs.Put(bp)
	for left := c.cur.streamLen(); left > 0; {
		n, err := c.nc.Read((*bp)[:min(left, int64(len(*bp)))])
		left -= int64(n)
		if err != nil && left > 0 {
			c.rbroke = ioErr(ctx, fmt.Sprintf("skip payload of frame %d", c.cur.RequestID), unexpected(err))
			return c.rbroke
		}
	}
	return nil
}

// discardBufs are the scratch buffers Discard reads skipped payloads into: readChunk bytes, so
// skipping a refused 140 MiB video takes hundreds of reads, not tens of thousands.
var discardBufs = sync.Pool{New: func() any { b := make([]byte, readChunk); return &b }}
