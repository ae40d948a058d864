package native

/*
#include "dp_media.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// MaxImageSide is the largest width or height the image kernels accept.
const MaxImageSide = C.DP_IMAGE_MAX_SIDE

// JPEGInfo is what a JPEG frame header says.
type JPEGInfo struct {
	Width, Height int
	Subsampling   int // TurboJPEG TJSAMP_* code
	Colorspace    int // TurboJPEG TJCS_* code
}

// JPEGHeader reads the dimensions of a JPEG without decoding pixels.
func JPEGHeader(data []byte) (JPEGInfo, error) {
	var info C.dp_jpeg_info
	var msg msgBuf
	st := C.dp_jpeg_header(cBytes(data), C.size_t(len(data)), &info, msg.ptr(), msg.len())
	if err := errorOf("JPEGHeader", st, &msg); err != nil {
		return JPEGInfo{}, err
	}
	return JPEGInfo{int(info.width), int(info.height), int(info.subsamp), int(info.colorspace)}, nil
}

// DecodeJPEG decodes a JPEG of the given size (from JPEGHeader) into dst as packed RGB
// (3*w*h bytes), exactly as libjpeg's defaults, and so Pillow, decode it. A truncated or
// corrupt stream is an error, never a partly grey picture.
func DecodeJPEG(dst []byte, data []byte, w, h int) error {
	if w < 1 || h < 1 || w > MaxImageSide || h > MaxImageSide {
		return invalid("DecodeJPEG", "bad size %dx%d", w, h)
	}
	if len(dst) < 3*w*h {
		return invalid("DecodeJPEG", "dst holds %d bytes, %dx%d RGB needs %d", len(dst), w, h, 3*w*h)
	}
	var msg msgBuf
	st := C.dp_jpeg_decode_rgb(cBytes(data), C.size_t(len(data)), (*C.uint8_t)(dataPtr(dst)), C.size_t(len(dst)),
		C.int32_t(w), C.int32_t(h), msg.ptr(), msg.len())
	return errorOf("DecodeJPEG", st, &msg)
}

// Filter is a resampling filter with Pillow's definition.
type Filter uint8

const (
	Bilinear Filter = C.DP_FILTER_BILINEAR
	Bicubic  Filter = C.DP_FILTER_BICUBIC
)

func (f Filter) String() string {
	if f == Bilinear {
		return "bilinear"
	}
	return "bicubic"
}

// Rect is a window [X, X+W) x [Y, Y+H).
type Rect struct{ X, Y, W, H int }

// ResizeJob resizes a packed 8-bit image Src (SrcW x SrcH, Channels 1..4) to OutW x OutH and
// writes the window Crop of the result to Dst (Crop.W*Crop.H*Channels bytes).
type ResizeJob struct {
	Src        []byte
	SrcW, SrcH int
	Channels   int
	OutW, OutH int
	Crop       Rect
	Dst        []byte
	Filter     Filter
	ISA        ISA // zero value: the best variant here
}

// Resize runs Pillow's resampling bit for bit (see dp_resize in dp_media.h). Cropping inside the
// call gives the same bytes as resizing fully and cropping, and skips the dropped pixels.
func Resize(j *ResizeJob) error {
	const op = "Resize"
	for _, d := range []int{j.SrcW, j.SrcH, j.OutW, j.OutH} {
		if d < 1 || d > MaxImageSide {
			return invalid(op, "bad size: source %dx%d, output %dx%d", j.SrcW, j.SrcH, j.OutW, j.OutH)
		}
	}
	if j.Channels < 1 || j.Channels > 4 {
		return invalid(op, "%d channels (1..4)", j.Channels)
	}
	if len(j.Src) < j.SrcW*j.SrcH*j.Channels {
		return invalid(op, "src holds %d bytes, %dx%dx%d needs %d", len(j.Src), j.SrcW, j.SrcH, j.Channels, j.SrcW*j.SrcH*j.Channels)
	}
	if j.Crop.W < 1 || j.Crop.H < 1 || j.Crop.W > MaxImageSide || j.Crop.H > MaxImageSide {
		return invalid(op, "bad crop size %dx%d", j.Crop.W, j.Crop.H)
	}
	if len(j.Dst) < j.Crop.W*j.Crop.H*j.Channels {
		return invalid(op, "dst holds %d bytes, %dx%dx%d needs %d", len(j.Dst), j.Crop.W, j.Crop.H, j.Channels, j.Crop.W*j.Crop.H*j.Channels)
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(unsafe.SliceData(j.Src))
	pin.Pin(unsafe.SliceData(j.Dst))
	job := C.dp_resize_job{
		src: (*C.uint8_t)(dataPtr(j.Src)), src_w: C.int32_t(j.SrcW), src_h: C.int32_t(j.SrcH), channels: C.int32_t(j.Channels),
		out_w: C.int32_t(j.OutW), out_h: C.int32_t(j.OutH),
		crop_x: C.int32_t(j.Crop.X), crop_y: C.int32_t(j.Crop.Y), crop_w: C.int32_t(j.Crop.W), crop_h: C.int32_t(j.Crop.H),
		dst: (*C.uint8_t)(dataPtr(j.Dst)), filter: C.int32_t(j.Filter),
	}
	var msg msgBuf
	st := C.dp_resize(&job, j.ISA.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// JPEGResize decodes the JPEG data (j.SrcW x j.SrcH, from JPEGHeader; j.Channels 3, j.Src
// unused) and resizes it as Resize does, decoding only the source window the crop needs (see
// dp_jpeg_resize): the bytes DecodeJPEG + Resize give, without the full picture.
func JPEGResize(data []byte, j *ResizeJob) error {
	const op = "JPEGResize"
	if j.SrcW < 1 || j.SrcH < 1 || j.SrcW > MaxImageSide || j.SrcH > MaxImageSide || j.Channels != 3 {
		return invalid(op, "bad source %dx%dx%d (RGB)", j.SrcW, j.SrcH, j.Channels)
	}
	if j.Crop.W < 1 || j.Crop.H < 1 || j.Crop.W > MaxImageSide || j.Crop.H > MaxImageSide {
		return invalid(op, "bad crop size %dx%d", j.Crop.W, j.Crop.H)
	}
	if len(j.Dst) < j.Crop.W*j.Crop.H*3 {
		return invalid(op, "dst holds %d bytes, %dx%dx3 needs %d", len(j.Dst), j.Crop.W, j.Crop.H, j.Crop.W*j.Crop.H*3)
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(unsafe.SliceData(j.Dst))
	job := C.dp_resize_job{
		src_w: C.int32_t(j.SrcW), src_h: C.int32_t(j.SrcH), channels: 3,
		out_w: C.int32_t(j.OutW), out_h: C.int32_t(j.OutH),
		crop_x: C.int32_t(j.Crop.X), crop_y: C.int32_t(j.Crop.Y), crop_w: C.int32_t(j.Crop.W), crop_h: C.int32_t(j.Crop.H),
		dst: (*C.uint8_t)(dataPtr(j.Dst)), filter: C.int32_t(j.Filter),
	}
	var msg msgBuf
	st := C.dp_jpeg_resize(cBytes(data), C.size_t(len(data)), &job, j.ISA.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// Orient applies an EXIF orientation (1..8) to src (w x h, channels 1..4) into dst, as Pillow's
// ImageOps.exif_transpose does; for 5..8 the result is h x w.
func Orient(dst, src []byte, w, h, channels, orientation int) error {
	if w < 1 || h < 1 || w > MaxImageSide || h > MaxImageSide || channels < 1 || channels > 4 {
		return invalid("Orient", "bad image %dx%dx%d", w, h, channels)
	}
	if n := w * h * channels; len(src) < n || len(dst) < n {
		return invalid("Orient", "src (%d bytes) and dst (%d bytes) must hold %d", len(src), len(dst), n)
	}
	var msg msgBuf
	st := C.dp_image_orient((*C.uint8_t)(dataPtr(src)), C.int32_t(w), C.int32_t(h), C.int32_t(channels), C.int32_t(orientation),
		(*C.uint8_t)(dataPtr(dst)), msg.ptr(), msg.len())
	return errorOf("Orient", st, &msg)
}

// Normalize writes the packed RGB image src (w x h) as a CHW tensor of dtype into dst:
// ((v / divisor) - mean[c]) / std[c] in float32, as torchvision's ToTensor + Normalize compute it,
// then rounded to dtype.
func Normalize(dst []byte, dtype DType, src []byte, w, h int, mean, std [3]float32, divisor float32) error {
	return NormalizeISA(dst, dtype, src, w, h, mean, std, divisor, ISAAuto)
}

// NormalizeISA is Normalize with a chosen kernel variant (tests run every variant).
func NormalizeISA(dst []byte, dtype DType, src []byte, w, h int, mean, std [3]float32, divisor float32, isa ISA) error {
	if w < 1 || h < 1 || w > MaxImageSide || h > MaxImageSide {
		return invalid("Normalize", "bad size %dx%d", w, h)
	}
	if dtype.Size() == 0 {
		return invalid("Normalize", "unknown dtype %v", dtype)
	}
	if len(src) < 3*w*h || len(dst) < 3*w*h*dtype.Size() {
		return invalid("Normalize", "src holds %d bytes (need %d), dst %d (need %d)", len(src), 3*w*h, len(dst), 3*w*h*dtype.Size())
	}
	var msg msgBuf
	st := C.dp_image_normalize((*C.uint8_t)(dataPtr(src)), C.int32_t(w), C.int32_t(h), (*C.float)(&mean[0]), (*C.float)(&std[0]),
		C.float(divisor), dataPtr(dst), C.int32_t(dtype), isa.c(), msg.ptr(), msg.len())
	return errorOf("Normalize", st, &msg)
}

// cBytes is data as a C pointer (nil when empty).
func cBytes(data []byte) unsafe.Pointer { return dataPtr(data) }
