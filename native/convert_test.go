package native

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// allPatterns is every 16-bit pattern, as little-endian bytes.
func allPatterns() []byte {
	b := make([]byte, 2<<16)
	for p := range 1 << 16 {
		binary.LittleEndian.PutUint16(b[2*p:], uint16(p))
	}
	return b
}

func convert(t *testing.T, isa ISA, dt DType, src []byte, st DType) []byte {
	t.Helper()
	dst := make([]byte, len(src)/st.Size()*dt.Size())
	require.NoError(t, ConvertISA(dst, dt, src, st, isa))
	return dst
}

// forEachISA runs f once per kernel variant this machine supports.
func forEachISA(t *testing.T, f func(t *testing.T, isa ISA)) {
	for _, isa := range SupportedISAs() {
		t.Run(isa.String(), func(t *testing.T) { f(t, isa) })
	}
}

// Every 16-bit pattern widens exactly and narrows back to itself (NaNs come back quieted).
func TestRoundTripEveryPattern(t *testing.T) {
	forEachISA(t, func(t *testing.T, isa ISA) {
		for _, dt := range []DType{F16, BF16} {
			f := formatOf(dt)
			src := allPatterns()
			wide := convert(t, isa, F32, src, dt)
			back := convert(t, isa, dt, wide, F32)
			for p := range 1 << 16 {
				want := math.Float32bits(f.widen(uint16(p)))
				if got := binary.LittleEndian.Uint32(wide[4*p:]); got != want {
					t.Fatalf("%v %#04x -> f32: got %#08x, want %#08x", dt, p, got, want)
				}
				if got, want := binary.LittleEndian.Uint16(back[2*p:]), f.quiet(uint16(p)); got != want {
					t.Fatalf("%v %#04x -> f32 -> %v: got %#04x, want %#04x", dt, p, dt, got, want)
				}
			}
		}
	})
}

// narrowingInputs is a set of f32 values that exercise rounding into format f: for every pair
// of neighbouring patterns (including the largest finite and Inf) the exact midpoint and the
// f32 values just around it; signed zeros, Inf, NaNs whose payload sits only in the bits that
// are cut off; and random bit patterns.
func narrowingInputs(t *testing.T, f format16) []float32 {
	var in []float32
	for p := uint16(0); p < f.inf; p++ {
		mid := float32((f.value(p) + f.value(p+1)) / 2) // exact: it needs one more bit than f has
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1)))} {
			in = append(in, x, -x)
		}
	}
	specials := []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7f800001, 0xff800001, 0x7fc00000,
		0x7f801fff, 0x7fbfffff, 0x7fffffff, 0x7f7fffff, 0x00000001, 0x807fffff, 0x00800000}
	for _, b := range specials {
		in = append(in, math.Float32frombits(b))
	}
	r := newRand(t)
	for range 1 << 18 {
		in = append(in, math.Float32frombits(r.Uint32()))
	}
	return in
}

func TestNarrowingAgainstReference(t *testing.T) {
	forEachISA(t, func(t *testing.T, isa ISA) {
		for _, dt := range []DType{F16, BF16} {
			f := formatOf(dt)
			in := narrowingInputs(t, f)
			got := convert(t, isa, dt, AsBytes(in), F32)
			bad := 0
			for i, x := range in {
				if g, w := binary.LittleEndian.Uint16(got[2*i:]), f.round(x); g != w {
					t.Errorf("f32 %#08x (%g) -> %v: got %#04x, want %#04x", math.Float32bits(x), x, dt, g, w)
					if bad++; bad > 10 {
						t.FailNow()
					}
				}
			}
		}
	})
}

// f16 <-> bf16 for every pattern: the reference rounds the exact f32 value of the source.
func TestCrossConversionEveryPattern(t *testing.T) {
	forEachISA(t, func(t *testing.T, isa ISA) {
		for _, c := range []struct{ dst, src DType }{{BF16, F16}, {F16, BF16}} {
			src := allPatterns()
			got := convert(t, isa, c.dst, src, c.src)
			for p := range 1 << 16 {
				want := formatOf(c.dst).round(formatOf(c.src).widen(uint16(p)))
				if g := binary.LittleEndian.Uint16(got[2*p:]); g != want {
					t.Fatalf("%v %#04x -> %v: got %#04x, want %#04x", c.src, p, c.dst, g, want)
				}
			}
		}
	})
}

// The vector loops run 8 or 16 elements a step; every length and start alignment must give
// the same elements as the reference, and nothing past the end may be written.
func TestConvertLengthsAndOffsets(t *testing.T) {
	r := newRand(t)
	dtypes := []DType{F32, F16, BF16}
	forEachISA(t, func(t *testing.T, isa ISA) {
		for _, st := range dtypes {
			for _, dt := range dtypes {
				for n := 0; n <= 40; n++ {
					for off := 0; off < 3; off++ {
						src := randomBytes(r, (n+off)*st.Size())[off*st.Size():]
						want := make([]byte, (n+1)*dt.Size())
						for i := range want {
							want[i] = 0xa5
						}
						got := append([]byte(nil), want...)
						refConvertAll(want, dt, src, st)
						require.NoError(t, ConvertISA(got[:n*dt.Size()], dt, src, st, isa))
						require.Equal(t, want, got, "%v -> %v, n=%d, offset %d", st, dt, n, off)
					}
				}
			}
		}
	})
}

func TestConvertErrors(t *testing.T) {
	f := func(dst []byte, dt DType, src []byte, st DType, want string) {
		t.Helper()
		err := Convert(dst, dt, src, st)
		require.Error(t, err)
		require.True(t, errors.Is(err, ErrInvalid), "%v", err)
		require.Contains(t, err.Error(), want)
	}
	f(make([]byte, 8), F16, make([]byte, 8), DType(7), "unknown dtype")
	f(make([]byte, 8), DType(9), make([]byte, 8), F32, "unknown dtype")
	f(make([]byte, 8), F16, make([]byte, 7), F32, "not a whole number")
	f(make([]byte, 3), F16, make([]byte, 8), F32, "dst holds 3 bytes")

	buf := make([]byte, 8)
	err := Convert(buf, F16, buf, F32)
	require.ErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), "in-place")
	require.NoError(t, Convert(buf, F32, buf, F32), "an in-place copy is allowed")
}

func TestDTypeNames(t *testing.T) {
	for _, dt := range []DType{F32, F16, BF16} {
		got, err := ParseDType(dt.String())
		require.NoError(t, err)
		require.Equal(t, dt, got)
	}
	got, err := ParseDType("BF16")
	require.NoError(t, err)
	require.Equal(t, BF16, got)
	_, err = ParseDType("f8")
	require.ErrorContains(t, err, `"f8"`)
	require.Equal(t, fmt.Sprint(DType(9)), "dtype(9)")
}

// DType.Size, written in Go, answers as the C runtime's dp_dtype_size for every dtype value.
func TestDTypeSizeIsC(t *testing.T) {
	for v := range 256 {
		d := DType(v)
		require.Equal(t, d.cSize(), d.Size(), "dtype %d", v)
	}
}
