package native

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// readNPZ reads every array of a numpy .npz (a zip of .npy files) holding little-endian float32
// C-order arrays, keyed by name without ".npy".
func readNPZ(t testing.TB, path string) map[string]npyArray {
	t.Helper()
	z, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	out := map[string]npyArray{}
	for _, f := range z.File {
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		a, err := parseNPY(raw)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		out[strings.TrimSuffix(f.Name, ".npy")] = a
	}
	return out
}

type npyArray struct {
	Shape []int
	Data  []float32
}

var npyShape = regexp.MustCompile(`'shape':\s*\(([^)]*)\)`)

// parseNPY reads a version 1.x/2.x .npy: magic, version, header length, a Python dict literal
// header ('descr', 'fortran_order', 'shape'), then the data.
func parseNPY(raw []byte) (npyArray, error) {
	if len(raw) < 10 || !bytes.Equal(raw[:6], []byte("\x93NUMPY")) {
		return npyArray{}, fmt.Errorf("not a .npy file")
	}
	var hlen, start int
	switch raw[6] {
	case 1:
		hlen, start = int(binary.LittleEndian.Uint16(raw[8:])), 10
	case 2, 3:
		hlen, start = int(binary.LittleEndian.Uint32(raw[8:])), 12
	default:
		return npyArray{}, fmt.Errorf(".npy version %d", raw[6])
	}
	if start+hlen > len(raw) {
		return npyArray{}, fmt.Errorf("header runs past the file")
	}
	h := string(raw[start : start+hlen])
	if !strings.Contains(h, "'descr': '<f4'") || !strings.Contains(h, "'fortran_order': False") {
		return npyArray{}, fmt.Errorf("want little-endian float32 in C order, header %q", h)
	}
	m := npyShape.FindStringSubmatch(h)
	if m == nil {
		return npyArray{}, fmt.Errorf("no shape in header %q", h)
	}
	var a npyArray
	n := 1
	for _, s := range strings.Split(m[1], ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := strconv.Atoi(s)
		if err != nil {
			return npyArray{}, fmt.Errorf("shape %q: %v", m[1], err)
		}
		a.Shape = append(a.Shape, d)
		n *= d
	}
	data := raw[start+hlen:]
	if len(data) != 4*n {
		return npyArray{}, fmt.Errorf("%d data bytes for shape %v", len(data), a.Shape)
	}
	a.Data = make([]float32, n)
	for i := range a.Data {
		a.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return a, nil
}
