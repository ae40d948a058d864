// Package transfer hands merged features to LLM workers in the forms they read: vLLM's
// prompt_embeds (a base64 torch.save of the [seq_len, hidden] tensor, for engines started with
// --enable-prompt-embeds) and vLLM's EC-connector shared-storage layout
// (<dir>/<mm_hash>/encoder_cache.safetensors holding one tensor, ec_cache).
package transfer

import (
	"archive/zip"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	"dataplane/native"
)

// torch.save's zip layout: every record under one folder; data records start on 64-byte
// boundaries (PyTorch pads local headers with an extra field, id "FB", to get there).
const (
	archiveDir = "archive/"
	alignment  = 64
)

// storageClass is the torch storage type pickle refers to for each dtype.
var storageClass = map[native.DType]string{
	native.F32:  "FloatStorage",
	native.F16:  "HalfStorage",
	native.BF16: "BFloat16Storage",
}

// PromptEmbeds writes m ([seq_len, hidden]) as torch.save does for a contiguous CPU tensor, so
// torch.load(weights_only=True) returns it with m's dtype and shape.
func PromptEmbeds(w io.Writer, m native.Matrix) error {
	cls, ok := storageClass[m.DType]
	if !ok {
		return fmt.Errorf("transfer: prompt_embeds of dtype %v (want f32, f16 or bf16)", m.DType)
	}
	if m.Rows <= 0 || m.Cols <= 0 || len(m.Data) < m.Bytes() {
		return fmt.Errorf("transfer: prompt_embeds of shape [%d, %d] with %d bytes", m.Rows, m.Cols, len(m.Data))
	}
	cw := &countingWriter{w: w}
	zw := zip.NewWriter(cw)
	records := []struct {
		name string
		data []byte
	}{
		{"data.pkl", tensorPickle(cls, m.Rows, m.Cols)},
		{"byteorder", []byte("little")},
		{"data/0", m.Data[:m.Bytes()]},
		{"version", []byte("3\n")},
	}
	for _, r := range records {
		if err := storeAligned(zw, cw, archiveDir+r.name, r.data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// PromptEmbedsBase64 is the prompt_embeds value of a vLLM completions request.
func PromptEmbedsBase64(m native.Matrix) (string, error) {
	var buf bytes.Buffer
	buf.Grow(m.Bytes() + 1024)
	if err := PromptEmbeds(&buf, m); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

// storeAligned writes one uncompressed record whose data starts at a multiple of alignment.
func storeAligned(zw *zip.Writer, cw *countingWriter, name string, data []byte) error {
	if err := zw.Flush(); err != nil {
		return err
	}
	const localHeader = 30
	start := cw.n + localHeader + int64(len(name))
	pad := (alignment - (start+4)%alignment) % alignment // 4: the extra field's own header
	extra := make([]byte, 4+pad)
	binary.LittleEndian.PutUint16(extra[0:], 0x4246) // "FB", as PyTorch writes it
	binary.LittleEndian.PutUint16(extra[2:], uint16(pad))
	hdr := &zip.FileHeader{
		Name:               name,
		Method:             zip.Store,
		CRC32:              crc32.ChecksumIEEE(data),
		CompressedSize64:   uint64(len(data)),
		UncompressedSize64: uint64(len(data)),
		Extra:              extra,
	}
	fw, err := zw.CreateRaw(hdr)
	if err != nil {
		return err
	}
	_, err = fw.Write(data)
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// tensorPickle is the protocol-2 pickle torch.save writes for a contiguous [rows, cols]
// tensor on storage "0": torch._utils._rebuild_tensor_v2(persistent storage, 0, size,
// stride, False, OrderedDict()).
func tensorPickle(cls string, rows, cols int) []byte {
	var p pickler
	p.op(0x80, 2) // PROTO 2
	p.global("torch._utils", "_rebuild_tensor_v2")
	p.op('(') // MARK: the arguments
	p.op('(') // MARK: the persistent id ('storage', class, key, location, numel)
	p.str("storage")
	p.global("torch", cls)
	p.str("0")
	p.str("cpu")
	p.int(int64(rows) * int64(cols))
	p.op('t') // TUPLE
	p.op('Q') // BINPERSID
	p.int(0)  // storage offset
	p.op('(')
	p.int(int64(rows))
	p.int(int64(cols))
	p.op('t') // size
	p.op('(')
	p.int(int64(cols))
	p.int(1)
	p.op('t')  // stride
	p.op(0x89) // NEWFALSE: requires_grad
	p.global("collections", "OrderedDict")
	p.op(')') // EMPTY_TUPLE
	p.op('R') // REDUCE: backward_hooks = OrderedDict()
	p.op('t') // TUPLE: the arguments
	p.op('R') // REDUCE: call _rebuild_tensor_v2
	p.op('.') // STOP
	return p.b
}

type pickler struct{ b []byte }

func (p *pickler) op(b ...byte) { p.b = append(p.b, b...) }

func (p *pickler) global(module, name string) {
	p.op('c')
	p.b = append(p.b, module...)
	p.op('\n')
	p.b = append(p.b, name...)
	p.op('\n')
}

func (p *pickler) str(s string) { // BINUNICODE
	p.op('X')
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	p.b = append(p.b, s...)
}

func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v < 256:
		p.op('K', byte(v)) // BININT1
	case v >= -1<<31 && v < 1<<31:
		p.op('J') // BININT
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(v)))
	default: // LONG1: 8 bytes little-endian two's complement
		p.op(0x8a, 8)
		p.b = binary.LittleEndian.AppendUint64(p.b, uint64(v))
	}
}
