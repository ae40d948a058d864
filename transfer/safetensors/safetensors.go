// Package safetensors reads and writes Hugging Face safetensors files: an 8-byte little-endian
// header length, a JSON header mapping tensor names to dtype, shape and a byte range, then the
// data. Files are memory-mapped and every number in the header is checked before use, since
// checkpoints and feature files come from outside: the header length against a limit and the
// file, each range against its dtype and shape (with overflow checks), duplicate names (JSON
// decoders would silently keep the last), and the ranges against each other, which must tile
// the data section exactly, as the reference implementation requires.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"dataplane/native"
)

// Limits on what a header may declare.
const (
	MaxHeaderBytes = 100 << 20 // the reference implementation's limit
	MaxTensors     = 1 << 20
	MaxRank        = 16
)

// dtypeSizes are the element sizes of the dtypes the format defines.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"U16": 2, "I16": 2, "F16": 2, "BF16": 2,
	"U32": 4, "I32": 4, "F32": 4,
	"U64": 8, "I64": 8, "F64": 8,
}

// DTypeSize is the element size of a safetensors dtype name, 0 if unknown.
func DTypeSize(dtype string) int { return dtypeSizes[dtype] }

// DTypeName is the safetensors spelling of a native dtype: F32, F16, BF16.
func DTypeName(t native.DType) string { return strings.ToUpper(t.String()) }

// Tensor is one named tensor. In a File, Data is a view of the mapping, valid until Close.
type Tensor struct {
	Name  string
	DType string // safetensors spelling: F32, F16, BF16, ...
	Shape []int
	Data  []byte
}

// Elements is the product of the shape (1 for a scalar).
func (t Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32 returns the tensor's values as float32, converting F16 and BF16 (exactly). F32 data
// is copied so the result outlives the file.
func (t Tensor) Float32() ([]float32, error) {
	dt, err := native.ParseDType(t.DType)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: dtype %s is not a float type", t.Name, t.DType)
	}
	out := make([]float32, t.Elements())
	if err := native.Convert(native.AsBytes(out), native.F32, t.Data, dt); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return out, nil
}

// ErrFormat is what every malformed-file error unwraps to.
var ErrFormat = errors.New("malformed safetensors")

// FormatError says what is wrong with a file, and with which tensor where one is to blame.
type FormatError struct {
	Tensor string // "" when the problem is not one tensor's
	Msg    string
}

func (e *FormatError) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("safetensors: tensor %q: %s", e.Tensor, e.Msg)
	}
	return "safetensors: " + e.Msg
}

func (e *FormatError) Unwrap() error { return ErrFormat }

func formatErr(tensor, format string, args ...any) error {
	return &FormatError{Tensor: tensor, Msg: fmt.Sprintf(format, args...)}
}

// File is a parsed safetensors file. Tensors are in data order.
type File struct {
	Tensors  []Tensor
	Metadata map[string]string
	byName   map[string]int
	mapping  []byte // the whole file when memory-mapped; nil for Parse
}

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (Tensor, bool) {
	i, ok := f.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return f.Tensors[i], true
}

// Close unmaps a file from Open; tensors' Data must not be used afterwards.
func (f *File) Close() error {
	if f.mapping == nil {
		return nil
	}
	err := syscall.Munmap(f.mapping)
	f.mapping = nil
	return err
}

// Open memory-maps and parses a file.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < 8 {
		return nil, fmt.Errorf("%s: %w", path, formatErr("", "file of %d bytes is shorter than the 8-byte header length", st.Size()))
	}
	if st.Size() > math.MaxInt {
		return nil, fmt.Errorf("%s: file too large to map", path)
	}
	m, err := syscall.Mmap(int(fd.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	f, err := Parse(m)
	if err != nil {
		syscall.Munmap(m) //nolint:errcheck // the parse error is the one to report
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.mapping = m
	return f, nil
}

// header is one tensor's entry in the JSON header.
type header struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// Parse reads a whole file held in b; tensors' Data are views of b.
func Parse(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, formatErr("", "%d bytes is shorter than the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderBytes {
		return nil, formatErr("", "header length %d exceeds the %d-byte limit", n, MaxHeaderBytes)
	}
	if n > uint64(len(b)-8) {
		return nil, formatErr("", "header length %d runs past the end of the %d-byte file", n, len(b))
	}
	hdr, data := b[8:8+n], b[8+n:]
	if len(bytes.TrimSpace(hdr)) == 0 || bytes.TrimLeft(hdr, " \t\r\n")[0] != '{' {
		return nil, formatErr("", "header is not a JSON object")
	}
	f := &File{byName: map[string]int{}}
	var begins []int64 // each tensor's offset in data, for checkTiling
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if _, err := dec.Token(); err != nil { // the opening brace
		return nil, formatErr("", "header: %v", err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, formatErr("", "header: %v", err)
		}
		name := tok.(string) // object keys are always strings
		if _, dup := f.byName[name]; dup || (name == "__metadata__" && f.Metadata != nil) {
			return nil, formatErr(name, "appears twice in the header")
		}
		if name == "__metadata__" {
			if err := dec.Decode(&f.Metadata); err != nil {
				return nil, formatErr("", "__metadata__ must map strings to strings: %v", err)
			}
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			continue
		}
		if len(f.Tensors) == MaxTensors {
			return nil, formatErr("", "more than %d tensors", MaxTensors)
		}
		var h header
		if err := dec.Decode(&h); err != nil {
			return nil, formatErr(name, "entry: %v", err)
		}
		t, err := h.tensor(name, data)
		if err != nil {
			return nil, err
		}
		f.byName[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
		begins = append(begins, h.DataOffsets[0])
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, formatErr("", "header: %v", err)
	}
	if rest := bytes.TrimSpace(hdr[dec.InputOffset():]); len(rest) > 0 {
		return nil, formatErr("", "%d bytes after the header's JSON object", len(rest))
	}
	if err := f.checkTiling(begins, len(data)); err != nil {
		return nil, err
	}
	return f, nil
}

// tensor checks one header entry and returns the tensor it describes.
func (h header) tensor(name string, data []byte) (Tensor, error) {
	size := dtypeSizes[h.DType]
	if size == 0 {
		return Tensor{}, formatErr(name, "unknown dtype %q", h.DType)
	}
	if h.Shape == nil {
		return Tensor{}, formatErr(name, "no shape")
	}
	if len(h.Shape) > MaxRank {
		return Tensor{}, formatErr(name, "rank %d exceeds %d", len(h.Shape), MaxRank)
	}
	if len(h.DataOffsets) != 2 {
		return Tensor{}, formatErr(name, "data_offsets has %d numbers, want 2", len(h.DataOffsets))
	}
	begin, end := h.DataOffsets[0], h.DataOffsets[1]
	if begin < 0 || end < begin || end > int64(len(data)) {
		return Tensor{}, formatErr(name, "data_offsets [%d, %d] outside the %d-byte data section", begin, end, len(data))
	}
	shape := make([]int, len(h.Shape))
	for i, d := range h.Shape {
		if d < 0 {
			return Tensor{}, formatErr(name, "negative dimension %d", d)
		}
		shape[i] = int(d)
	}
	need := int64(size)
	if slices.Contains(h.Shape, 0) {
		need = 0
	}
	for _, d := range h.Shape {
		if need > 0 && need > int64(len(data))/d { // more bytes than the file holds: stop before overflow
			return Tensor{}, formatErr(name, "shape %v needs more bytes than the file has", h.Shape)
		}
		need *= d
	}
	if need != end-begin {
		return Tensor{}, formatErr(name, "shape %v of %s needs %d bytes, data_offsets give %d", h.Shape, h.DType, need, end-begin)
	}
	return Tensor{Name: name, DType: h.DType, Shape: shape, Data: data[begin:end:end]}, nil
}

// checkTiling requires the tensors, starting at begins, to cover the data section exactly: no
// overlaps (two names for one range) and no holes. Tensors end up in data order.
func (f *File) checkTiling(begins []int64, dataLen int) error {
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return begins[order[a]] < begins[order[b]] })
	sorted := make([]Tensor, len(order))
	at := int64(0)
	for i, j := range order {
		t := f.Tensors[j]
		switch s := begins[j]; {
		case s < at:
			return formatErr(t.Name, "bytes [%d, %d) overlap tensor %q", s, s+int64(len(t.Data)), sorted[i-1].Name)
		case s > at:
			return formatErr(t.Name, "starts at byte %d, leaving bytes [%d, %d) of the data section unused", s, at, s)
		}
		at += int64(len(t.Data))
		sorted[i] = t
		f.byName[t.Name] = i
	}
	if at != int64(dataLen) {
		return formatErr("", "tensors cover %d bytes of a %d-byte data section", at, dataLen)
	}
	f.Tensors = sorted
	return nil
}

// Write writes tensors (in the order given) and metadata as a safetensors file. The header is
// padded with spaces to a multiple of 8 bytes so the data starts aligned.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	entries := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		entries["__metadata__"] = metadata
	}
	var at int64
	for _, t := range tensors {
		size := dtypeSizes[t.DType]
		if size == 0 {
			return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if t.Name == "" || t.Name == "__metadata__" {
			return fmt.Errorf("safetensors: bad tensor name %q", t.Name)
		}
		if _, dup := entries[t.Name]; dup {
			return fmt.Errorf("safetensors: tensor %q given twice", t.Name)
		}
		if slices.ContainsFunc(t.Shape, func(d int) bool { return d < 0 }) || t.Elements()*size != len(t.Data) {
			return fmt.Errorf("safetensors: tensor %q: shape %v of %s needs %d bytes, data has %d",
				t.Name, t.Shape, t.DType, t.Elements()*size, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		entries[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": []int64{at, at + int64(len(t.Data))}}
		at += int64(len(t.Data))
	}
	hdr, err := json.Marshal(entries)
	if err != nil {
		return fmt.Errorf("safetensors: header: %w", err)
	}
	if pad := (8 - len(hdr)%8) % 8; pad > 0 {
		hdr = append(hdr, bytes.Repeat([]byte{' '}, pad)...)
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes the file under a temporary name in the same directory, syncs it and renames
// it into place, so a reader never sees a partial file.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()           //nolint:errcheck // already failing
			os.Remove(tmp.Name()) //nolint:errcheck
		}
	}()
	if err = Write(tmp, tensors, metadata); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
