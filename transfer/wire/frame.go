// Package wire is the daemons' framed binary protocol for moving tensors between them: encoded
// features back from a remote encoder, media inputs to it, and error frames that say why an
// item failed. One frame is a fixed 64-byte header, a small metadata block (the item's
// feature-store key and a text field) and a payload of raw tensor bytes.
//
// The payload is never copied in user space: the sender writes header and payload with one
// writev from wherever the bytes live (a feature-store view), and the receiver reads it
// straight into memory it chose (a features.Job buffer admitted against its own budget). On
// one node the payload can instead stay in a memfd whose descriptor travels with the header
// (SCM_RIGHTS over a Unix socket) and the receiver maps it: nothing is copied at all.
//
// Every length is checked against limits before anything is allocated; the header carries its
// own checksum and the payload's (XXH3-64), so a corrupted or truncated frame is an error,
// never garbage features.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"

	"dataplane/features"
)

// Magic opens every frame.
const Magic = "DPWF"

// Version is the protocol version this package speaks; a frame of another version is refused.
// Version 2 added the compressed length (FlagS2, FlagZstd) and grew the header to 72 bytes.
const Version = 2

// HeaderSize is the fixed part of a frame header, before the metadata block.
const HeaderSize = 72

// Limits on what a frame may declare, checked before anything is allocated or read.
const (
	// MaxKeyField matches the feature store's limit on each key field.
	MaxKeyField = 1024
	// MaxText bounds the text field (an error message, a model option string).
	MaxText = 4096
	// MaxMeta bounds the whole metadata block: five length-prefixed strings.
	MaxMeta = 5*2 + 4*MaxKeyField + MaxText
	// DefaultMaxPayload bounds a payload unless Options say otherwise: a 30-frame video of
	// LLaVA-sized features (30 × 576 × 4096 × 2 bytes) is 141 MiB.
	DefaultMaxPayload = 1 << 30
)

// Kind says what a frame carries. Kinds are generic: the payload is a [Rows, Cols] tensor of
// DType (or nothing), the key names the item, Text is free-form.
type Kind uint8

const (
	// KindFeatures carries an item's encoded features (the answer to KindEncode, or a push).
	KindFeatures Kind = 1
	// KindEncode asks the peer to encode an item: the payload is the preprocessed input tensor,
	// the key names the item (its Model says which encoder), Text carries options.
	KindEncode Kind = 2
	// KindError says that the item of RequestID failed; Text is the reason. No payload.
	KindError Kind = 3
	// kindMax is the highest kind this version knows; others are refused.
	kindMax = KindError
)

func (k Kind) String() string {
	switch k {
	case KindFeatures:
		return "features"
	case KindEncode:
		return "encode"
	case KindError:
		return "error"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// DType is the element type of a payload. The codes are part of the protocol, not
// native.DType's numbering.
type DType uint8

const (
	DTypeNone DType = 0 // no tensor (error frames, opaque bytes)
	DTypeF32  DType = 1
	DTypeF16  DType = 2
	DTypeBF16 DType = 3
	DTypeU8   DType = 4
	dtypeMax        = DTypeU8
)

// Size is the element size in bytes (0 for DTypeNone).
func (d DType) Size() int {
	switch d {
	case DTypeF32:
		return 4
	case DTypeF16, DTypeBF16:
		return 2
	case DTypeU8:
		return 1
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case DTypeNone:
		return "none"
	case DTypeF32:
		return "f32"
	case DTypeF16:
		return "f16"
	case DTypeBF16:
		return "bf16"
	case DTypeU8:
		return "u8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Flags are per-frame options. The shared-memory ones need a Unix socket.
type Flags uint16

const (
	// FlagShm: the payload is not in the stream but in the memfd passed with the header
	// (SCM_RIGHTS): bytes [ShmOffset, ShmOffset+Len).
	FlagShm Flags = 1 << 0
	// FlagS2, FlagZstd: the payload in the stream is CompressedLen bytes of s2 (block format)
	// or zstd (one frame), which decompress to Len bytes; for 2-byte dtypes those are the
	// payload byte-shuffled (the low bytes of all elements, then the high bytes). Sum is over
	// the decompressed, unshuffled payload. Never with a shared-memory flag. Bit 3 is reserved.
	FlagS2   Flags = 1 << 1
	FlagZstd Flags = 1 << 2
	flagsZip       = FlagS2 | FlagZstd

	// FlagShmReply: the memfd passed with the header is where the answer goes: bytes
	// [ShmOffset, ShmOffset+ShmLen) of the requester's memory (a features.Job's buffer). The
	// frame's own payload, if any, is in the stream.
	FlagShmReply Flags = 1 << 4
	// FlagInPlace: the answer to a FlagShmReply request: its Len bytes were written at the
	// start of the range the request named; nothing follows in the stream.
	FlagInPlace Flags = 1 << 5

	knownFlags = FlagShm | FlagShmReply | FlagInPlace | flagsZip
)

// Header describes one frame.
type Header struct {
	Kind      Kind
	Flags     Flags
	RequestID uint64
	Key       features.Key // the item; empty for frames that need none
	DType     DType
	Rows      uint32
	Cols      uint32
	Len       int64  // payload bytes
	Sum       uint64 // XXH3-64 of the payload (Checksum); Send computes it when 0
	ShmOffset int64  // FlagShm, FlagShmReply: where the range starts in the memfd
	ShmLen    int64  // FlagShmReply: the range's length (FlagShm: Len; set by SendShm)
	// CompressedLen is the payload's size in the stream when FlagS2 or FlagZstd is set (set by
	// Send): below Len, so a receiver never holds more than the payload it admitted.
	CompressedLen int64
	Text          string // KindError: the reason; otherwise free-form (≤ MaxText bytes)
}

// Error kinds, for errors.Is.
var (
	// ErrFrame: the peer sent something that is not a valid frame (bad magic, version, kind,
	// lengths, header checksum). The connection cannot be resynchronised and should be closed.
	ErrFrame = errors.New("wire: bad frame")
	// ErrTooLarge: a frame declares more than the receiver's limits allow.
	ErrTooLarge = errors.New("wire: frame too large")
	// ErrChecksum: the payload did not match its checksum. The stream is still in sync.
	ErrChecksum = errors.New("wire: payload checksum mismatch")
	// ErrRemote: the peer sent an error frame for the item (RemoteError has its text).
	ErrRemote = errors.New("wire: remote error")
)

// RemoteError is a KindError frame turned into an error.
type RemoteError struct {
	RequestID uint64
	Key       features.Key
	Message   string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("wire: peer failed request %d (item %q): %s", e.RequestID, e.Key.Content, e.Message)
}

func (e *RemoteError) Unwrap() error { return ErrRemote }

// Err is the frame as an error when it is a KindError frame, else nil.
func (h *Header) Err() error {
	if h.Kind != KindError {
		return nil
	}
	return &RemoteError{RequestID: h.RequestID, Key: h.Key, Message: h.Text}
}

func frameErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrFrame}, a...)...)
}

// check validates the fields a sender controls, before anything is written.
func (h *Header) check(maxPayload int64) error {
	if h.Kind == 0 || h.Kind > kindMax {
		return frameErr("unknown kind %d", h.Kind)
	}
	if h.Flags&^knownFlags != 0 {
		return frameErr("unknown flags %#x", uint16(h.Flags&^knownFlags))
	}
	if h.DType > dtypeMax {
		return frameErr("unknown dtype %d", h.DType)
	}
	if h.Len < 0 || h.ShmOffset < 0 || h.ShmLen < 0 || h.CompressedLen < 0 {
		return frameErr("negative length %d, offset %d, shared length %d or compressed length %d", h.Len, h.ShmOffset, h.ShmLen, h.CompressedLen)
	}
	if h.ShmLen > maxPayload {
		return fmt.Errorf("%w: shared range of %d bytes (at most %d)", ErrTooLarge, h.ShmLen, maxPayload)
	}
	if h.Len > maxPayload {
		return fmt.Errorf("%w: payload of %d bytes (at most %d)", ErrTooLarge, h.Len, maxPayload)
	}
	if h.DType != DTypeNone {
		// The shape must say exactly how many bytes follow, so a receiver can size its buffer
		// from the header alone.
		if want := int64(h.Rows) * int64(h.Cols) * int64(h.DType.Size()); want != h.Len {
			return frameErr("[%d, %d] %v is %d bytes, payload is %d", h.Rows, h.Cols, h.DType, want, h.Len)
		}
	} else if h.Rows != 0 || h.Cols != 0 {
		return frameErr("shape [%d, %d] without a dtype", h.Rows, h.Cols)
	}
	if h.Kind == KindError && (h.Len != 0 || h.Flags != 0) {
		return frameErr("error frame with a payload")
	}
	if h.Flags&flagsZip != 0 {
		// A compressed frame is a plain stream frame that shrank: anything else is sent raw.
		if h.Flags&flagsZip == flagsZip || h.Flags&(FlagShm|FlagShmReply|FlagInPlace) != 0 {
			return frameErr("flags %#x: one codec, and not with shared memory", uint16(h.Flags))
		}
		if h.CompressedLen <= 0 || h.CompressedLen >= h.Len {
			return frameErr("compressed length %d for a payload of %d (want 1 to %d)", h.CompressedLen, h.Len, h.Len-1)
		}
	} else if h.CompressedLen != 0 {
		return frameErr("a compressed length without FlagS2 or FlagZstd")
	}
	switch h.Flags & (FlagShm | FlagShmReply | FlagInPlace) {
	case 0, FlagInPlace:
		if h.ShmOffset != 0 || h.ShmLen != 0 {
			return frameErr("a shared range without FlagShm or FlagShmReply")
		}
		if h.Flags&FlagInPlace != 0 && h.Len == 0 {
			return frameErr("an in-place answer of no bytes")
		}
	case FlagShm:
		if h.Len == 0 || h.ShmLen != h.Len {
			return frameErr("shared-memory payload of %d bytes, range of %d", h.Len, h.ShmLen)
		}
	case FlagShmReply:
		if h.ShmLen == 0 {
			return frameErr("an empty reply range")
		}
	default:
		return frameErr("flags %#x combine shared-memory roles", uint16(h.Flags))
	}
	for _, f := range [...]string{h.Key.Salt, h.Key.Content, h.Key.Model, h.Key.Preprocess} {
		if len(f) > MaxKeyField {
			return fmt.Errorf("%w: key field of %d bytes (at most %d)", ErrTooLarge, len(f), MaxKeyField)
		}
	}
	if len(h.Text) > MaxText {
		return fmt.Errorf("%w: text of %d bytes (at most %d)", ErrTooLarge, len(h.Text), MaxText)
	}
	return nil
}

// metaLen is the size of the metadata block.
func (h *Header) metaLen() int {
	return 5*2 + len(h.Key.Salt) + len(h.Key.Content) + len(h.Key.Model) + len(h.Key.Preprocess) + len(h.Text)
}

// AppendHeader appends the encoded header (fixed part and metadata) to dst. h.Len and h.Sum
// must already describe the payload. It fails for a header that Check refuses.
func AppendHeader(dst []byte, h *Header, maxPayload int64) ([]byte, error) {
	if err := h.check(maxPayload); err != nil {
		return dst, err
	}
	start := len(dst)
	le := binary.LittleEndian
	dst = append(dst, Magic...)
	dst = append(dst, Version, byte(h.Kind))
	dst = le.AppendUint16(dst, uint16(h.Flags))
	dst = le.AppendUint64(dst, h.RequestID)
	dst = le.AppendUint64(dst, uint64(h.Len))
	dst = le.AppendUint64(dst, h.Sum)
	dst = le.AppendUint64(dst, uint64(h.ShmOffset))
	dst = le.AppendUint32(dst, h.Rows)
	dst = le.AppendUint32(dst, h.Cols)
	dst = append(dst, byte(h.DType), 0)
	dst = le.AppendUint16(dst, uint16(h.metaLen()))
	dst = le.AppendUint64(dst, uint64(h.ShmLen))
	dst = le.AppendUint64(dst, uint64(h.CompressedLen))
	dst = le.AppendUint32(dst, 0) // header sum, filled below
	for _, s := range [...]string{h.Key.Salt, h.Key.Content, h.Key.Model, h.Key.Preprocess, h.Text} {
		dst = le.AppendUint16(dst, uint16(len(s)))
		dst = append(dst, s...)
	}
	le.PutUint32(dst[start+sumAt:], headerSum(dst[start:]))
	return dst, nil
}

// sumAt is where the header checksum sits: the fixed part's last 4 bytes.
const sumAt = HeaderSize - 4

// headerSum is the low 32 bits of XXH3-64 over the header with its sum field zero, and the
// metadata: a flipped length bit is caught before the length is trusted.
func headerSum(b []byte) uint32 {
	var fixed [HeaderSize]byte
	copy(fixed[:], b[:HeaderSize])
	clear(fixed[sumAt:])
	h := xxh3.New()
	h.Write(fixed[:])
	h.Write(b[HeaderSize:])
	return uint32(h.Sum64())
}

// parseFixed reads the fixed part and returns the metadata length it declares. The header
// sum is checked once the metadata is in (parseMeta).
func parseFixed(b []byte, h *Header, maxPayload int64) (metaLen int, err error) {
	if len(b) < HeaderSize {
		return 0, frameErr("header of %d bytes, want %d", len(b), HeaderSize)
	}
	if string(b[:4]) != Magic {
		return 0, frameErr("magic %q, want %q", b[:4], Magic)
	}
	if b[4] != Version {
		return 0, frameErr("version %d, this side speaks %d", b[4], Version)
	}
	le := binary.LittleEndian
	n, off, shm, zn := le.Uint64(b[16:]), le.Uint64(b[32:]), le.Uint64(b[52:]), le.Uint64(b[60:])
	if n > 1<<62 || off > 1<<62 || shm > 1<<62 || zn > 1<<62 {
		return 0, frameErr("length %d, offset %d, shared length %d or compressed length %d out of range", n, off, shm, zn)
	}
	*h = Header{
		Kind:      Kind(b[5]),
		Flags:     Flags(le.Uint16(b[6:])),
		RequestID: le.Uint64(b[8:]),
		Len:       int64(n),
		Sum:       le.Uint64(b[24:]),
		ShmOffset: int64(off),
		ShmLen:    int64(shm),
		Rows:      le.Uint32(b[40:]),
		Cols:      le.Uint32(b[44:]),
		DType:     DType(b[48]),

		CompressedLen: int64(zn),
	}
	if b[49] != 0 {
		return 0, frameErr("reserved byte %d", b[49])
	}
	metaLen = int(le.Uint16(b[50:]))
	if metaLen < 5*2 || metaLen > MaxMeta {
		return 0, fmt.Errorf("%w: metadata of %d bytes (want 10 to %d)", ErrFrame, metaLen, MaxMeta)
	}
	return metaLen, nil
}

// parseMeta checks the header sum over fixed ‖ meta, reads the metadata into h and validates
// the whole header.
func parseMeta(fixed, meta []byte, h *Header, maxPayload int64) error {
	var buf [HeaderSize + MaxMeta]byte
	b := append(append(buf[:0], fixed[:HeaderSize]...), meta...)
	if got, want := headerSum(b), binary.LittleEndian.Uint32(fixed[sumAt:]); got != want {
		return frameErr("header checksum %#08x, computed %#08x", want, got)
	}
	var fields [5]string
	for i := range fields {
		if len(meta) < 2 {
			return frameErr("metadata ends in field %d", i)
		}
		n := int(binary.LittleEndian.Uint16(meta))
		meta = meta[2:]
		if n > len(meta) {
			return frameErr("metadata field %d of %d bytes, %d left", i, n, len(meta))
		}
		fields[i], meta = string(meta[:n]), meta[n:]
	}
	if len(meta) != 0 {
		return frameErr("%d bytes after the metadata fields", len(meta))
	}
	h.Key = features.Key{Salt: fields[0], Content: fields[1], Model: fields[2], Preprocess: fields[3]}
	h.Text = fields[4]
	return h.check(maxPayload)
}

// DecodeHeader decodes one complete header (fixed part and metadata) from the front of b and
// returns how many bytes it took. It is what a Conn does on the stream, for tests and tools.
func DecodeHeader(b []byte, maxPayload int64) (Header, int, error) {
	var h Header
	metaLen, err := parseFixed(b, &h, maxPayload)
	if err != nil {
		return Header{}, 0, err
	}
	if len(b) < HeaderSize+metaLen {
		return Header{}, 0, frameErr("metadata of %d bytes, %d present", metaLen, len(b)-HeaderSize)
	}
	if err := parseMeta(b[:HeaderSize], b[HeaderSize:HeaderSize+metaLen], &h, maxPayload); err != nil {
		return Header{}, 0, err
	}
	return h, HeaderSize + metaLen, nil
}

// Checksum is the payload checksum the protocol uses: XXH3-64 (see the README for why not
// CRC-32C).
func Checksum(p []byte) uint64 { return xxh3.Hash(p) }

// streamLen is how many payload bytes follow the header in the stream.
func (h *Header) streamLen() int64 {
	switch {
	case h.Flags&(FlagShm|FlagInPlace) != 0:
		return 0
	case h.Flags&flagsZip != 0:
		return h.CompressedLen
	}
	return h.Len
}
