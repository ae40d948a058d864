package mocker

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Profiles come in Dynamo's format: a NumPy .npz (a zip of .npy arrays) with prefill_isl,
// prefill_ttft_ms (1-D), decode_active_kv_tokens, decode_context_length (1-D) and decode_itl
// (2-D, [kv][context]), as numpy.savez writes them. Arrays may be float64, float32, int64 or
// int32, little-endian, C order.

// ErrNPY reports a malformed .npz or .npy: which array and what is wrong.
type ErrNPY struct{ Array, Problem string }

func (e *ErrNPY) Error() string { return fmt.Sprintf("npz %s: %s", e.Array, e.Problem) }

// maxNPYBytes bounds one array (a profile is a few KB; this only stops a hostile file).
const maxNPYBytes = 64 << 20

// ReadProfile reads a perf profile .npz from r (size bytes) and checks it.
func ReadProfile(r io.ReaderAt, size int64) (*Interpolated, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, &ErrNPY{"(archive)", err.Error()}
	}
	arrays := map[string]npyArray{}
	for _, f := range zr.File {
		name := strings.TrimSuffix(f.Name, ".npy")
		switch name {
		case "prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl":
		default:
			continue
		}
		if f.UncompressedSize64 > maxNPYBytes {
			return nil, &ErrNPY{name, fmt.Sprintf("%d bytes, more than %d", f.UncompressedSize64, maxNPYBytes)}
		}
		rc, err := f.Open()
		if err != nil {
			return nil, &ErrNPY{name, err.Error()}
		}
		raw, err := io.ReadAll(io.LimitReader(rc, maxNPYBytes+1))
		rc.Close()
		if err != nil {
			return nil, &ErrNPY{name, err.Error()}
		}
		a, err := ParseNPY(raw)
		if err != nil {
			return nil, &ErrNPY{name, err.Error()}
		}
		arrays[name] = a
	}
	get := func(name string, dims int) (npyArray, error) {
		a, ok := arrays[name]
		if !ok {
			return a, &ErrNPY{name, "missing"}
		}
		if len(a.Shape) != dims {
			return a, &ErrNPY{name, fmt.Sprintf("shape %v, want %d dimensions", a.Shape, dims)}
		}
		return a, nil
	}
	var m Interpolated
	for _, f := range []struct {
		name string
		dst  *[]float64
	}{{"prefill_isl", &m.PrefillTokens}, {"prefill_ttft_ms", &m.PrefillMS}, {"decode_active_kv_tokens", &m.DecodeKV}, {"decode_context_length", &m.DecodeContext}} {
		a, err := get(f.name, 1)
		if err != nil {
			return nil, err
		}
		*f.dst = a.Data
	}
	itl, err := get("decode_itl", 2)
	if err != nil {
		return nil, err
	}
	for r := range itl.Shape[0] {
		m.DecodeMS = append(m.DecodeMS, itl.Data[r*itl.Shape[1]:(r+1)*itl.Shape[1]])
	}
	if err := m.Check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// npyArray is a parsed .npy: its shape and values as float64.
type npyArray struct {
	Shape []int
	Data  []float64
}

// ParseNPY parses one .npy file (format versions 1 to 3).
func ParseNPY(raw []byte) (npyArray, error) {
	var a npyArray
	if len(raw) < 10 || !bytes.Equal(raw[:6], []byte("\x93NUMPY")) {
		return a, fmt.Errorf("not a .npy file (no \\x93NUMPY magic)")
	}
	var hlen, off int
	switch raw[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(raw[8:10])), 10
	case 2, 3:
		if len(raw) < 12 {
			return a, fmt.Errorf("truncated header")
		}
		hlen, off = int(binary.LittleEndian.Uint32(raw[8:12])), 12
	default:
		return a, fmt.Errorf("format version %d.%d not supported", raw[6], raw[7])
	}
	if hlen > len(raw)-off {
		return a, fmt.Errorf("header of %d bytes runs past the end", hlen)
	}
	header := string(raw[off : off+hlen])
	body := raw[off+hlen:]
	descr, err := headerValue(header, "descr")
	if err != nil {
		return a, err
	}
	fortran, err := headerValue(header, "fortran_order")
	if err != nil {
		return a, err
	}
	if fortran != "False" {
		return a, fmt.Errorf("fortran_order %s: only C order is supported", fortran)
	}
	shapeText, err := headerValue(header, "shape")
	if err != nil {
		return a, err
	}
	n := 1
	for _, f := range strings.Split(strings.Trim(shapeText, "()"), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 || d > maxNPYBytes {
			return a, fmt.Errorf("bad shape %s", shapeText)
		}
		a.Shape = append(a.Shape, d)
		if n *= d; n > maxNPYBytes {
			return a, fmt.Errorf("shape %s is too large", shapeText)
		}
	}
	descr = strings.Trim(descr, `'"`)
	var size int
	var read func(b []byte) float64
	switch descr {
	case "<f8":
		size, read = 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }
	case "<f4":
		size, read = 4, func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) }
	case "<i8":
		size, read = 8, func(b []byte) float64 { return float64(int64(binary.LittleEndian.Uint64(b))) }
	case "<i4":
		size, read = 4, func(b []byte) float64 { return float64(int32(binary.LittleEndian.Uint32(b))) }
	default:
		return a, fmt.Errorf("dtype %s not supported (want <f8, <f4, <i8 or <i4)", descr)
	}
	if len(body) != n*size {
		return a, fmt.Errorf("%d data bytes for shape %s of %s (want %d)", len(body), shapeText, descr, n*size)
	}
	a.Data = make([]float64, n)
	for i := range a.Data {
		a.Data[i] = read(body[i*size:])
	}
	return a, nil
}

// headerValue finds 'key': VALUE in a .npy header dict literal; VALUE ends at the next
// top-level comma or closing brace (a shape tuple's commas are inside parentheses).
func headerValue(header, key string) (string, error) {
	i := strings.Index(header, "'"+key+"'")
	if i < 0 {
		return "", fmt.Errorf("header has no %q", key)
	}
	rest := strings.TrimLeft(header[i+len(key)+2:], " ")
	if !strings.HasPrefix(rest, ":") {
		return "", fmt.Errorf("header: no ':' after %q", key)
	}
	rest = strings.TrimLeft(rest[1:], " ")
	depth := 0
	for j, c := range rest {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',', '}':
			if depth == 0 {
				return strings.TrimSpace(rest[:j]), nil
			}
		}
	}
	return "", fmt.Errorf("header: value of %q does not end", key)
}
