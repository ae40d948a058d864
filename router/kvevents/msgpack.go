package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// A small MessagePack reader for the subset vLLM's msgspec encoder writes: nil, bool, ints,
// floats, str, bin, arrays, maps (ext is skipped). It reads in place (strings and bins alias the
// payload), never allocates, and turns every malformed input into a *DecodeError.

// DecodeError says what was wrong with a payload and at which byte.
type DecodeError struct {
	Offset int
	What   string
}

func (e *DecodeError) Error() string { return fmt.Sprintf("msgpack byte %d: %s", e.Offset, e.What) }

type mpReader struct {
	b   []byte
	off int
}

// Value kinds, as far as the decoder cares.
const (
	mpNil = iota
	mpBool
	mpInt
	mpFloat
	mpStr
	mpBin
	mpArray
	mpMap
	mpExt
	mpInvalid
)

func (r *mpReader) fail(what string) error { return &DecodeError{Offset: r.off, What: what} }

func (r *mpReader) done() bool { return r.off >= len(r.b) }

// kind is the kind of the next value, without consuming it.
func (r *mpReader) kind() int {
	if r.off >= len(r.b) {
		return mpInvalid
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f || c >= 0xe0:
		return mpInt
	case c <= 0x8f:
		return mpMap
	case c <= 0x9f:
		return mpArray
	case c <= 0xbf:
		return mpStr
	}
	switch c {
	case 0xc0:
		return mpNil
	case 0xc2, 0xc3:
		return mpBool
	case 0xc4, 0xc5, 0xc6:
		return mpBin
	case 0xca, 0xcb:
		return mpFloat
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return mpInt
	case 0xd9, 0xda, 0xdb:
		return mpStr
	case 0xdc, 0xdd:
		return mpArray
	case 0xde, 0xdf:
		return mpMap
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return mpExt
	}
	return mpInvalid
}

// take returns the next n bytes.
func (r *mpReader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, r.fail(fmt.Sprintf("%d bytes wanted, %d left", n, len(r.b)-r.off))
	}
	v := r.b[r.off : r.off+n]
	r.off += n
	return v, nil
}

func (r *mpReader) uintN(n int) (uint64, error) {
	if n > len(r.b)-r.off {
		return 0, r.fail(fmt.Sprintf("%d bytes wanted, %d left", n, len(r.b)-r.off))
	}
	b := r.b[r.off:]
	r.off += n
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// nil consumes a nil and reports whether there was one.
func (r *mpReader) readNil() bool {
	if r.kind() == mpNil {
		r.off++
		return true
	}
	return false
}

// readInt reads any integer and returns its low 64 bits (negative values in two's complement)
// and whether it was negative.
func (r *mpReader) readInt() (uint64, bool, error) {
	if r.off >= len(r.b) {
		return 0, false, r.fail("want an integer, payload ended")
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	case c < 0xcc || c > 0xd3:
		return 0, false, r.fail("want an integer")
	}
	r.off++
	n := 1 << (c & 3) // 0xcc..0xcf and 0xd0..0xd3: 1, 2, 4, 8 bytes
	v, err := r.uintN(n)
	if err != nil || c < 0xd0 {
		return v, false, err
	}
	// Sign-extend the n-byte value.
	shift := uint(64 - 8*n)
	sv := int64(v<<shift) >> shift
	return uint64(sv), sv < 0, nil
}

// readSmallInt reads an integer that must fit in [lo, hi].
func (r *mpReader) readSmallInt(lo, hi int64, what string) (int64, error) {
	at := r.off
	v, neg, err := r.readInt()
	if err != nil {
		return 0, err
	}
	s := int64(v)
	if (!neg && v > math.MaxInt64) || s < lo || s > hi {
		return 0, &DecodeError{Offset: at, What: fmt.Sprintf("%s out of range [%d, %d]", what, lo, hi)}
	}
	return s, nil
}

// readFloat reads a float or an integer as float64.
func (r *mpReader) readFloat() (float64, error) {
	switch r.kind() {
	case mpFloat:
		c := r.b[r.off]
		r.off++
		if c == 0xca {
			v, err := r.uintN(4)
			return float64(math.Float32frombits(uint32(v))), err
		}
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	case mpInt:
		v, neg, err := r.readInt()
		if neg {
			return float64(int64(v)), err
		}
		return float64(v), err
	}
	return 0, r.fail("want a number")
}

// readStr reads a str or a bin and returns its bytes (aliasing the payload).
func (r *mpReader) readStr() ([]byte, error) {
	if r.off >= len(r.b) {
		return nil, r.fail("want a string, payload ended")
	}
	c := r.b[r.off]
	var n uint64
	var err error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		r.off++
		n, err = r.uintN(1)
	case c == 0xda || c == 0xc5:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdb || c == 0xc6:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, r.fail("want a string")
	}
	if err != nil {
		return nil, err
	}
	return r.take(int(n))
}

// readLen reads an array (wantMap false) or map header and returns its element count, checked
// against the bytes left so a hostile length cannot make callers allocate.
func (r *mpReader) readLen(wantMap bool) (int, error) {
	k := r.kind()
	if (wantMap && k != mpMap) || (!wantMap && k != mpArray) {
		if wantMap {
			return 0, r.fail("want a map")
		}
		return 0, r.fail("want an array")
	}
	c := r.b[r.off]
	r.off++
	var n uint64
	var err error
	switch {
	case c <= 0x9f:
		n = uint64(c & 0x0f)
	case c == 0xdc || c == 0xde:
		n, err = r.uintN(2)
	default:
		n, err = r.uintN(4)
	}
	if err != nil {
		return 0, err
	}
	per := uint64(1)
	if wantMap {
		per = 2
	}
	if n*per > uint64(len(r.b)-r.off) {
		return 0, r.fail(fmt.Sprintf("%d elements but only %d bytes left", n, len(r.b)-r.off))
	}
	return int(n), nil
}

// skip consumes one value of any kind, nested ones included, without recursion.
func (r *mpReader) skip() error {
	pending := 1
	for ; pending > 0; pending-- {
		if r.off >= len(r.b) {
			return r.fail("payload ended inside a value")
		}
		c := r.b[r.off]
		var err error
		switch r.kind() {
		case mpNil, mpBool:
			r.off++
		case mpInt:
			_, _, err = r.readInt()
		case mpFloat:
			_, err = r.readFloat()
		case mpStr, mpBin:
			_, err = r.readStr()
		case mpArray, mpMap:
			var n int
			n, err = r.readLen(r.kind() == mpMap)
			if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
				n *= 2
			}
			pending += n
		case mpExt:
			r.off++
			var n uint64
			switch c {
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
				n = 1 << (c - 0xd4)
			default:
				n, err = r.uintN(1 << (c - 0xc7))
			}
			if err == nil {
				_, err = r.take(int(n) + 1) // the type byte, then the data
			}
		default:
			return r.fail(fmt.Sprintf("invalid type byte %#x", c))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// be64 reads 8 big-endian bytes (vLLM's sequence frame).
func be64(b []byte) (uint64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
