package native

/*
#include <stdlib.h>
#include "dp_backend.h"

// Calls through a backend table (cgo cannot call C function pointers itself).
static int32_t be_device_count(const dp_backend *b) { return b->device_count(); }
static dp_status be_device_info(const dp_backend *b, int32_t d, dp_device_info *o, char *m, size_t n) { return b->device_info(d, o, m, n); }
static dp_status be_device_alloc(const dp_backend *b, int32_t d, int64_t bytes, void **o, char *m, size_t n) { return b->device_alloc(d, bytes, o, m, n); }
static void be_device_free(const dp_backend *b, int32_t d, void *p) { b->device_free(d, p); }
static dp_status be_host_alloc(const dp_backend *b, int64_t bytes, void **o, char *m, size_t n) { return b->host_alloc(bytes, o, m, n); }
static void be_host_free(const dp_backend *b, void *p) { b->host_free(p); }
static dp_status be_stream_create(const dp_backend *b, int32_t d, int32_t t, dp_stream **o, char *m, size_t n) { return b->stream_create(d, t, o, m, n); }
static dp_status be_stream_sync(const dp_backend *b, dp_stream *s, char *m, size_t n) { return b->stream_sync(s, m, n); }
static void be_stream_destroy(const dp_backend *b, dp_stream *s) { b->stream_destroy(s); }
static dp_status be_copy(const dp_backend *b, dp_stream *s, void *dst, const void *src, int64_t bytes, int32_t kind, char *m, size_t n) { return b->copy(s, dst, src, bytes, kind, m, n); }
static dp_status be_convert(const dp_backend *b, dp_stream *s, void *dst, int32_t dt, const void *src, int32_t st, int64_t count, char *m, size_t n) { return b->convert(s, dst, dt, src, st, count, m, n); }
static dp_status be_merge(const dp_backend *b, dp_stream *s, const dp_merge_plan *p, char *m, size_t n) { return b->merge(s, p, m, n); }
static dp_status be_encoder_create(const dp_backend *b, int32_t d, const dp_encoder_config *c, const dp_matrix *w, int64_t nw, dp_encoder **o, char *m, size_t n) { return b->encoder_create(d, c, w, nw, o, m, n); }
static dp_status be_encoder_forward(const dp_backend *b, dp_stream *s, dp_encoder *e, const dp_encoder_output *sel, const dp_encoder_item *it, int64_t ni, char *m, size_t n) { return b->encoder_forward(s, e, sel, it, ni, m, n); }
static int64_t be_encoder_tokens(const dp_backend *b, const dp_encoder *e, const dp_encoder_output *sel, int64_t f) { return b->encoder_tokens(e, sel, f); }
static int64_t be_encoder_width(const dp_backend *b, const dp_encoder *e, const dp_encoder_output *sel) { return b->encoder_width(e, sel); }
static void be_encoder_free(const dp_backend *b, dp_encoder *e) { b->encoder_free(e); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// BackendABIVersion is the version of the backend table (dp_backend.h) this build drives.
const BackendABIVersion = C.DP_BACKEND_ABI_VERSION

// Backend is a compute backend: the CPU one built in, or a plugin's (the CUDA plugin, loaded
// by package cuda). Device memory belongs to the backend: GPU memory for CUDA, host memory for
// the CPU backend. The table lives as long as the process.
type Backend struct {
	t    *C.dp_backend
	name string
}

// CPU is the built-in CPU backend.
func CPU() *Backend { return &Backend{t: C.dp_cpu_backend(), name: "cpu"} }

// BackendFromTable wraps a plugin's table (the result of its dp_plugin_init), checking the
// ABI version and that every entry is set.
func BackendFromTable(table unsafe.Pointer) (*Backend, error) {
	t := (*C.dp_backend)(table)
	var msg msgBuf
	if err := errorOf("BackendFromTable", C.dp_backend_check(t, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, err
	}
	return &Backend{t: t, name: C.GoString(t.name)}, nil
}

// Name is the backend's name ("cpu", "cuda").
func (b *Backend) Name() string { return b.name }

// DeviceCount is the number of devices the backend drives (1 for the CPU).
func (b *Backend) DeviceCount() int { return int(C.be_device_count(b.t)) }

// DeviceInfo describes one device.
type DeviceInfo struct {
	Name                     string
	TotalBytes, FreeBytes    int64
	ComputeMajor, ComputeMin int
}

func (b *Backend) DeviceInfo(device int) (DeviceInfo, error) {
	var info C.dp_device_info
	var msg msgBuf
	if err := errorOf("DeviceInfo", C.be_device_info(b.t, C.int32_t(device), &info, msg.ptr(), msg.len()), &msg); err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{Name: C.GoString(&info.name[0]), TotalBytes: int64(info.total_bytes), FreeBytes: int64(info.free_bytes),
		ComputeMajor: int(info.compute_major), ComputeMin: int(info.compute_minor)}, nil
}

// DeviceBuffer is device memory. Its address is not Go memory; Free returns it.
type DeviceBuffer struct {
	b      *Backend
	device int
	p      unsafe.Pointer
	n      int64
}

// DeviceAlloc allocates n bytes on a device.
func (b *Backend) DeviceAlloc(device int, n int64) (*DeviceBuffer, error) {
	var p unsafe.Pointer
	var msg msgBuf
	if err := errorOf("DeviceAlloc", C.be_device_alloc(b.t, C.int32_t(device), C.int64_t(n), &p, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, err
	}
	return &DeviceBuffer{b: b, device: device, p: p, n: n}, nil
}

// Len is the buffer's size in bytes.
func (d *DeviceBuffer) Len() int64 { return d.n }

// Addr is the device address (for the transfer layer and the plugin).
func (d *DeviceBuffer) Addr() uintptr { return uintptr(d.p) }

// Free returns the memory; the buffer must not be used afterwards.
func (d *DeviceBuffer) Free() {
	if d.p != nil {
		C.be_device_free(d.b.t, C.int32_t(d.device), d.p)
		d.p = nil
	}
}

// at is the address of byte off, checked against the buffer.
func (d *DeviceBuffer) at(op string, off, n int64) (unsafe.Pointer, error) {
	if d == nil || d.p == nil || off < 0 || n < 0 || off > d.n || n > d.n-off {
		return nil, invalid(op, "bytes [%d, %d) outside a device buffer of %d", off, off+n, d.len())
	}
	return unsafe.Add(d.p, off), nil
}

func (d *DeviceBuffer) len() int64 {
	if d == nil {
		return 0
	}
	return d.n
}

// HostAlloc returns n bytes of host memory the backend can copy from and to fast (page-locked
// for CUDA) as a slice over C memory, and the function that frees it.
func (b *Backend) HostAlloc(n int) ([]byte, func(), error) {
	var p unsafe.Pointer
	var msg msgBuf
	if err := errorOf("HostAlloc", C.be_host_alloc(b.t, C.int64_t(n), &p, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*byte)(p), n), func() { C.be_host_free(b.t, p) }, nil
}

// Stream is an ordered queue of work on one device.
type Stream struct {
	b      *Backend
	device int
	s      *C.dp_stream
}

// NewStream creates a stream; threads is the CPU backend's thread count (0: DefaultThreads).
func (b *Backend) NewStream(device, threadCount int) (*Stream, error) {
	var s *C.dp_stream
	var msg msgBuf
	if err := errorOf("NewStream", C.be_stream_create(b.t, C.int32_t(device), C.int32_t(threads(threadCount)), &s, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, err
	}
	return &Stream{b: b, device: device, s: s}, nil
}

// Sync waits for everything queued so far.
func (s *Stream) Sync() error {
	var msg msgBuf
	return errorOf("Sync", C.be_stream_sync(s.b.t, s.s, msg.ptr(), msg.len()), &msg)
}

// Close destroys the stream after its work is done.
func (s *Stream) Close() error {
	err := s.Sync()
	C.be_stream_destroy(s.b.t, s.s)
	return err
}

// Upload queues a copy of src into dst at off. src must stay untouched until Sync.
func (s *Stream) Upload(dst *DeviceBuffer, off int64, src []byte) error {
	p, err := dst.at("Upload", off, int64(len(src)))
	if err != nil {
		return err
	}
	var msg msgBuf
	return errorOf("Upload", C.be_copy(s.b.t, s.s, p, dataPtr(src), C.int64_t(len(src)), C.DP_COPY_H2D, msg.ptr(), msg.len()), &msg)
}

// Download copies len(dst) bytes from src at off into dst and waits for it.
func (s *Stream) Download(dst []byte, src *DeviceBuffer, off int64) error {
	p, err := src.at("Download", off, int64(len(dst)))
	if err != nil {
		return err
	}
	var msg msgBuf
	if err := errorOf("Download", C.be_copy(s.b.t, s.s, dataPtr(dst), p, C.int64_t(len(dst)), C.DP_COPY_D2H, msg.ptr(), msg.len()), &msg); err != nil {
		return err
	}
	return s.Sync()
}

// DeviceMatrix is a [Rows, Cols] matrix of DType at byte Offset of a device buffer.
type DeviceMatrix struct {
	Buf        *DeviceBuffer
	Offset     int64
	DType      DType
	Rows, Cols int
}

func (m DeviceMatrix) c(op, what string) (C.dp_matrix, error) {
	bytes := int64(m.Rows) * int64(m.Cols) * int64(m.DType.Size())
	if m.DType.Size() == 0 || m.Rows < 0 || m.Cols < 0 {
		return C.dp_matrix{}, invalid(op, "%s: bad shape [%d, %d] or dtype %v", what, m.Rows, m.Cols, m.DType)
	}
	p, err := m.Buf.at(op, m.Offset, bytes)
	if err != nil {
		return C.dp_matrix{}, fmt.Errorf("%s: %w", what, err)
	}
	return C.dp_matrix{data: p, rows: C.int64_t(m.Rows), cols: C.int64_t(m.Cols), dtype: C.int32_t(m.DType)}, nil
}

// Convert queues a conversion of n elements between device matrices' memory.
func (s *Stream) Convert(dst DeviceMatrix, src DeviceMatrix) error {
	const op = "Stream.Convert"
	cd, err := dst.c(op, "dst")
	if err != nil {
		return err
	}
	cs, err := src.c(op, "src")
	if err != nil {
		return err
	}
	if dst.Rows*dst.Cols != src.Rows*src.Cols {
		return invalid(op, "%d elements into %d", src.Rows*src.Cols, dst.Rows*dst.Cols)
	}
	var msg msgBuf
	return errorOf(op, C.be_convert(s.b.t, s.s, cd.data, cd.dtype, cs.data, cs.dtype, C.int64_t(src.Rows*src.Cols), msg.ptr(), msg.len()), &msg)
}

// DeviceSpan is a media span of a device merge.
type DeviceSpan struct {
	Row int
	Src DeviceMatrix
}

// DeviceMergeInput is MergeInput on device memory; the text ids are device memory too (int32).
type DeviceMergeInput struct {
	Dst, Table DeviceMatrix
	TextIDs    *DeviceBuffer // int32 ids at offset 0
	NText      int
	Spans      []DeviceSpan
}

// Merge queues a merge (see Merge for the rules).
func (s *Stream) Merge(in DeviceMergeInput) error {
	const op = "Stream.Merge"
	dst, err := in.Dst.c(op, "dst")
	if err != nil {
		return err
	}
	table, err := in.Table.c(op, "embedding table")
	if err != nil {
		return err
	}
	ids, err := in.TextIDs.at(op, 0, int64(in.NText)*4)
	if err != nil && in.NText > 0 {
		return err
	}
	spans := (*C.dp_span)(C.malloc(C.size_t(len(in.Spans)+1) * C.size_t(unsafe.Sizeof(C.dp_span{}))))
	defer C.free(unsafe.Pointer(spans))
	cs := unsafe.Slice(spans, len(in.Spans))
	for i, sp := range in.Spans {
		m, err := sp.Src.c(op, fmt.Sprintf("span %d", i))
		if err != nil {
			return err
		}
		cs[i] = C.dp_span{dst_row: C.int64_t(sp.Row), src: m}
	}
	plan := C.dp_merge_plan{dst: dst, table: table, text_ids: (*C.int32_t)(ids), n_text: C.int64_t(in.NText),
		spans: spans, n_spans: C.int64_t(len(in.Spans))}
	var msg msgBuf
	return errorOf(op, C.be_merge(s.b.t, s.s, &plan, msg.ptr(), msg.len()), &msg)
}

// BackendEncoder is an encoder created on a backend's device.
type BackendEncoder struct {
	b   *Backend
	e   *C.dp_encoder
	cfg EncoderConfig
}

// NewEncoder uploads weights (host memory, as for NewEncoder) to a device.
func (b *Backend) NewEncoder(device int, cfg EncoderConfig, weights []Matrix) (*BackendEncoder, error) {
	const op = "Backend.NewEncoder"
	cw, cc, pin, err := encoderArgs(op, cfg, weights)
	defer pin.Unpin()
	if err != nil {
		return nil, err
	}
	var e *C.dp_encoder
	var msg msgBuf
	if err := errorOf(op, C.be_encoder_create(b.t, C.int32_t(device), &cc, cw, C.int64_t(len(weights)), &e, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, err
	}
	return &BackendEncoder{b: b, e: e, cfg: cfg}, nil
}

// Tokens and Width as for Encoder.
func (e *BackendEncoder) Tokens(sel OutputSelection, frames int) int {
	cs := sel.c()
	return int(C.be_encoder_tokens(e.b.t, e.e, &cs, C.int64_t(frames)))
}

func (e *BackendEncoder) Width(sel OutputSelection) int {
	cs := sel.c()
	return int(C.be_encoder_width(e.b.t, e.e, &cs))
}

// DeviceEncoderItem is an encoder item in device memory: Input is f32 of the model's input
// shape (see EncoderItem).
type DeviceEncoderItem struct {
	Input  DeviceMatrix
	Frames int
	Out    DeviceMatrix
}

// Forward queues one batch on s.
func (e *BackendEncoder) Forward(s *Stream, sel OutputSelection, items []DeviceEncoderItem) error {
	const op = "BackendEncoder.Forward"
	ci := (*C.dp_encoder_item)(C.malloc(C.size_t(len(items)+1) * C.size_t(unsafe.Sizeof(C.dp_encoder_item{}))))
	defer C.free(unsafe.Pointer(ci))
	cs := unsafe.Slice(ci, len(items))
	for i, it := range items {
		in, err := it.Input.c(op, fmt.Sprintf("item %d input", i))
		if err != nil {
			return err
		}
		if it.Input.DType != F32 {
			return invalid(op, "item %d: input dtype %v, want f32", i, it.Input.DType)
		}
		out, err := it.Out.c(op, fmt.Sprintf("item %d output", i))
		if err != nil {
			return err
		}
		cs[i] = C.dp_encoder_item{input: (*C.float)(in.data), frames: C.int64_t(it.Frames), out: out}
	}
	csel := sel.c()
	var msg msgBuf
	return errorOf(op, C.be_encoder_forward(e.b.t, s.s, e.e, &csel, ci, C.int64_t(len(items)), msg.ptr(), msg.len()), &msg)
}

// Close frees the encoder on its device.
func (e *BackendEncoder) Close() {
	if e.e != nil {
		C.be_encoder_free(e.b.t, e.e)
		e.e = nil
	}
}
