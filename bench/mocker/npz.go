package mocker

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sbinet/npyio/npy"
	"gonum.org/v1/gonum/mat"
)

// Profiles come in Dynamo's format: a NumPy .npz (a zip of .npy arrays) with prefill_isl,
// prefill_ttft_ms (1-D), decode_active_kv_tokens, decode_context_length (1-D) and decode_itl
// (2-D, [kv][context]), as numpy.savez or numpy.savez_compressed writes them. Arrays may be
// float64, float32, int64 or int32, either byte order, C or Fortran order.
//
// The archive is read with archive/zip rather than npyio's npz package, which hides each
// member's size: here it is checked before anything is inflated. Each array is decoded by
// npyio's npy reader behind the checks a file from elsewhere needs and that reader lacks.

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

// npyArray is a parsed .npy: its shape and values as float64, in C order.
type npyArray struct {
	Shape []int
	Data  []float64
}

// npyItemSize is the element size of each dtype a profile may use (without its byte-order
// character). The list also keeps npyio away from object arrays, which it would unpickle.
var npyItemSize = map[string]int{"f8": 8, "f4": 4, "i8": 8, "i4": 4}

// ParseNPY parses one .npy file (format versions 1 and 2, those npyio reads). It never
// panics: npyio slices a malformed header without checking it, so its panics become errors.
func ParseNPY(raw []byte) (a npyArray, err error) {
	// npyio allocates a version 2 header's declared length (up to 4 GiB) before reading it.
	if len(raw) >= 12 && bytes.HasPrefix(raw, npy.Magic[:]) && raw[6] == 2 {
		if hlen := binary.LittleEndian.Uint32(raw[8:12]); int64(hlen) > int64(len(raw)-12) {
			return a, fmt.Errorf("header of %d bytes runs past the end", hlen)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			a, err = npyArray{}, fmt.Errorf("malformed header (%v)", p)
		}
	}()
	body := bytes.NewReader(raw)
	r, err := npy.NewReader(body)
	if errors.Is(err, npy.ErrInvalidNumPyFormat) {
		return a, errors.New("not a .npy file (no \\x93NUMPY magic)")
	}
	if err != nil {
		return a, err
	}
	h := r.Header.Descr
	size, ok := npyItemSize[strings.TrimLeft(h.Type, "<>")]
	if !ok || len(h.Type) != 3 {
		return a, fmt.Errorf("dtype %s not supported (want f8, f4, i8 or i4, < or > byte order)", h.Type)
	}
	n := 1
	for _, d := range h.Shape {
		if d < 0 || d > maxNPYBytes {
			return a, fmt.Errorf("bad shape %v", h.Shape)
		}
		if n *= d; n > maxNPYBytes {
			return a, fmt.Errorf("shape %v is too large", h.Shape)
		}
	}
	// npyio decodes whatever follows the header, reading past a ragged end.
	if body.Len() != n*size {
		return a, fmt.Errorf("%d data bytes for shape %v of %s (want %d)", body.Len(), h.Shape, h.Type, n*size)
	}
	if h.Fortran && len(h.Shape) > 2 {
		return a, fmt.Errorf("fortran_order with %d dimensions not supported", len(h.Shape))
	}
	var arr npy.Array
	if err := r.Read(&arr); err != nil {
		return a, err
	}
	switch v := arr.Data().(type) {
	case []float64:
		a.Data = v
	case []float32:
		a.Data = toFloat64(v)
	case []int64:
		a.Data = toFloat64(v)
	case []int32:
		a.Data = toFloat64(v)
	default:
		return a, fmt.Errorf("dtype %s decoded as %T", h.Type, v)
	}
	a.Shape = h.Shape
	if h.Fortran && len(h.Shape) == 2 && len(a.Data) > 0 {
		// Column-major data is the transpose in row-major order; gonum/mat (already linked
		// in through npyio) transposes it back.
		t := mat.NewDense(h.Shape[1], h.Shape[0], a.Data).T()
		a.Data = mat.DenseCopyOf(t).RawMatrix().Data
	}
	return a, nil
}

func toFloat64[T float32 | int64 | int32](v []T) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
