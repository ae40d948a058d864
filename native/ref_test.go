package native

// An independent reference for the conversions: it shares no code or bit tricks with the C
// kernels. A 16-bit format's positive patterns, read as integers, are in increasing order of
// value, so rounding a number is a binary search over patterns plus a tie-to-even rule, with
// the values computed by math.Ldexp from the format's definition.

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// format16 describes a 16-bit float: manBits of mantissa, exponent bias, and the pattern of +Inf.
type format16 struct {
	manBits int
	bias    int
	inf     uint16
}

var (
	fmtF16  = format16{manBits: 10, bias: 15, inf: 0x7c00}
	fmtBF16 = format16{manBits: 7, bias: 127, inf: 0x7f80}
)

func formatOf(t DType) format16 {
	if t == F16 {
		return fmtF16
	}
	return fmtBF16
}

// value is the magnitude of a positive pattern p <= inf; inf maps to the value the next
// finite pattern would have had, which is where overflow rounding is decided.
func (f format16) value(p uint16) float64 {
	e := int(p >> f.manBits)
	m := float64(int(p) & (1<<f.manBits - 1))
	if e == 0 {
		return math.Ldexp(m, 1-f.bias-f.manBits)
	}
	return math.Ldexp(m+float64(int(1)<<f.manBits), e-f.bias-f.manBits)
}

func (f format16) isNaN(p uint16) bool { return p&0x7fff > f.inf }

// round is the pattern nearest to x (ties to even), or NaN per the documented rule.
func (f format16) round(x float32) uint16 {
	bits := math.Float32bits(x)
	sign := uint16(bits>>16) & 0x8000
	if x != x {
		// NaN: keep the sign and the payload's top bits, set the quiet bit.
		payload := bits & 0x7fffff
		return sign | f.inf | uint16(payload>>(23-f.manBits)) | 1<<(f.manBits-1)
	}
	a := math.Abs(float64(x))
	// Largest pattern with value <= a, over [0, inf].
	p := uint16(sort.Search(int(f.inf)+1, func(i int) bool { return f.value(uint16(i)) > a }) - 1)
	if p < f.inf && f.value(p) != a {
		lo, hi := a-f.value(p), f.value(p+1)-a
		if hi < lo || (hi == lo && p&1 == 1) {
			p++
		}
	}
	return sign | p
}

// widen is the float32 a pattern stands for; NaN per the documented rule (f16 quiets, bf16 is
// a plain shift).
func (f format16) widen(p uint16) float32 {
	if f.isNaN(p) {
		payload := (uint32(p) & (1<<f.manBits - 1)) << (23 - f.manBits)
		if f == fmtF16 {
			payload |= 1 << 22
		}
		return math.Float32frombits(uint32(p&0x8000)<<16 | 0x7f800000 | payload)
	}
	v := float32(f.value(p & 0x7fff))
	if p&0x7fff == f.inf {
		v = float32(math.Inf(1))
	}
	if p&0x8000 != 0 {
		v = -v
	}
	return v
}

// quiet is what a round trip through f32 makes of a pattern: NaNs get the quiet bit.
func (f format16) quiet(p uint16) uint16 {
	if f.isNaN(p) {
		return p | 1<<(f.manBits-1)
	}
	return p
}

// refConvert converts one element given as raw little-endian bytes.
func refConvert(dst []byte, dt DType, src []byte, st DType) {
	var x float32
	switch st {
	case F32:
		x = math.Float32frombits(binary.LittleEndian.Uint32(src))
	default:
		x = formatOf(st).widen(binary.LittleEndian.Uint16(src))
	}
	switch dt {
	case F32:
		if st == F32 {
			copy(dst, src[:4]) // a copy keeps NaN payloads bit for bit
			return
		}
		binary.LittleEndian.PutUint32(dst, math.Float32bits(x))
	default:
		if st == dt {
			copy(dst, src[:2])
			return
		}
		binary.LittleEndian.PutUint16(dst, formatOf(dt).round(x))
	}
}

// refConvertAll converts a whole buffer element by element.
func refConvertAll(dst []byte, dt DType, src []byte, st DType) {
	if dt == st {
		copy(dst, src) // a copy keeps every bit, NaN payloads included
		return
	}
	ds, ss := dt.Size(), st.Size()
	for i := 0; i*ss < len(src); i++ {
		refConvert(dst[i*ds:], dt, src[i*ss:], st)
	}
}

// newRand returns a generator seeded fresh each run; the seed is logged to reproduce a failure.
func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// randomBytes fills n bytes with random data that is never all zeros.
func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	var word [8]byte
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(word[:], r.Uint64())
		copy(b[i:], word[:])
	}
	if n > 0 {
		b[0] |= 1
	}
	return b
}
