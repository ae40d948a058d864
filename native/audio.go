package native

/*
#include "dp_media.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// Whisper's STFT parameters (16 kHz, 25 ms window, 10 ms hop).
const (
	WhisperNFFT       = C.DP_WHISPER_N_FFT
	WhisperHop        = C.DP_WHISPER_HOP
	WhisperSampleRate = C.DP_WHISPER_SAMPLE_RATE
	MaxFFT            = C.DP_FFT_MAX
	MaxSampleRate     = C.DP_RESAMPLE_MAX_RATE
)

func floatPtr(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(unsafe.SliceData(s)))
}

// FFTSupported reports whether FFT runs n points (a product of 2, 3 and 5, at most MaxFFT).
func FFTSupported(n int) bool { return n > 0 && n <= MaxFFT && C.dp_fft_supported(C.int32_t(n)) == 1 }

// FFT replaces (re, im) by its forward DFT, sum_j x[j] exp(-2 pi i j k / n), n = len(re).
func FFT(re, im []float32) error {
	if len(re) != len(im) || len(re) == 0 {
		return invalid("FFT", "re has %d values, im %d", len(re), len(im))
	}
	var msg msgBuf
	st := C.dp_fft(floatPtr(re), floatPtr(im), C.int32_t(len(re)), msg.ptr(), msg.len())
	return errorOf("FFT", st, &msg)
}

// RFFT writes bins 0..n/2 of the DFT of the n = len(x) real values x into re and im.
func RFFT(x, re, im []float32) error {
	n := len(x)
	if n < 2 || len(re) < n/2+1 || len(im) < n/2+1 {
		return invalid("RFFT", "%d values need %d bins, re has %d, im %d", n, n/2+1, len(re), len(im))
	}
	var msg msgBuf
	st := C.dp_rfft(floatPtr(x), C.int32_t(n), floatPtr(re), floatPtr(im), msg.ptr(), msg.len())
	return errorOf("RFFT", st, &msg)
}

// MelFilters is librosa's Slaney mel filter bank [nMels, nFFT/2+1] (row-major), as Whisper's
// mel_filters.npz holds it for (80 or 128, 400, 16000).
func MelFilters(nMels, nFFT, sampleRate int) ([]float32, error) {
	if nMels < 1 || nMels > 512 || nFFT < 2 || nFFT > MaxFFT {
		return nil, invalid("MelFilters", "%d mels, n_fft %d", nMels, nFFT)
	}
	out := make([]float32, nMels*(nFFT/2+1))
	var msg msgBuf
	st := C.dp_mel_filters(C.int32_t(nMels), C.int32_t(nFFT), C.int32_t(sampleRate), floatPtr(out), msg.ptr(), msg.len())
	if err := errorOf("MelFilters", st, &msg); err != nil {
		return nil, err
	}
	return out, nil
}

// LogMelFrames is the number of frames LogMel writes for n samples in all (samples + zeros).
func LogMelFrames(n int) int { return int(C.dp_log_mel_frames(C.int64_t(n))) }

// LogMelInput is one log-mel computation: Whisper's log-mel spectrogram of Samples followed by
// Zeros zeros (16 kHz), with Mels bins.
type LogMelInput struct {
	Samples []float32
	Zeros   int
	Mels    int
	Threads int // 0: DefaultThreads()
	ISA     ISA // zero value: the best variant here
}

// audioISA is the variant LogMel and Resample run for ISAAuto (ISAAuto: the best here).
var audioISA atomic.Int32

// SetAudioISA makes LogMel and Resample run variant isa where they are asked for ISAAuto, and
// returns the previous setting. Variants differ in the last bits of a log-mel (sums are
// reassociated), so this pins one variant's output: for files compared bit for bit across
// machines (the preprocess command's pinned sums are the AVX2 variant's), or a fleet that wants
// the same features from every node. An unsupported isa is an error at the next call.
func SetAudioISA(isa ISA) ISA { return ISA(audioISA.Swap(int32(isa))) }

func audioVariant(isa ISA) ISA {
	if isa == ISAAuto {
		return ISA(audioISA.Load())
	}
	return isa
}

// LogMel writes the [Mels, LogMelFrames(len(Samples)+Zeros)] spectrogram (frames contiguous) into
// dst and returns the log10 maximum the clamp used. See dp_log_mel in dp_media.h.
func LogMel(dst []float32, in LogMelInput) (float32, error) {
	if in.Mels < 1 || in.Zeros < 0 {
		return 0, invalid("LogMel", "%d mels, %d zeros", in.Mels, in.Zeros)
	}
	var msg msgBuf
	var mx C.float
	st := C.dp_log_mel(floatPtr(in.Samples), C.int64_t(len(in.Samples)), C.int64_t(in.Zeros), C.int32_t(in.Mels),
		floatPtr(dst), C.int64_t(len(dst)), &mx, C.int32_t(threads(in.Threads)), audioVariant(in.ISA).c(), msg.ptr(), msg.len())
	return float32(mx), errorOf("LogMel", st, &msg)
}

// ResampleLen is the output length for n samples from rateIn to rateOut, ceil(n*out/in), or -1
// for rates outside 1..MaxSampleRate.
func ResampleLen(n, rateIn, rateOut int) int {
	if rateIn < 1 || rateOut < 1 || rateIn > MaxSampleRate || rateOut > MaxSampleRate {
		return -1
	}
	return int(C.dp_resample_len(C.int64_t(n), C.int32_t(rateIn), C.int32_t(rateOut)))
}

// Resample converts mono samples from rateIn to rateOut into dst (ResampleLen samples) with a
// Kaiser-windowed sinc (libswresample's default design; see dp_resample in dp_media.h).
func Resample(dst, src []float32, rateIn, rateOut int, isa ISA) error {
	if rateIn < 1 || rateOut < 1 || rateIn > MaxSampleRate || rateOut > MaxSampleRate {
		return invalid("Resample", "rates %d -> %d Hz (1..%d)", rateIn, rateOut, MaxSampleRate)
	}
	var msg msgBuf
	st := C.dp_resample(floatPtr(src), C.int64_t(len(src)), C.int32_t(rateIn), C.int32_t(rateOut), floatPtr(dst),
		C.int64_t(len(dst)), audioVariant(isa).c(), msg.ptr(), msg.len())
	return errorOf("Resample", st, &msg)
}

// LogMelDFT is LogMel done the straightforward way (one thread, a dense DFT matrix product per
// frame): the reference the benchmarks compare with and an FFT-free cross-check.
func LogMelDFT(dst []float32, in LogMelInput) error {
	if in.Mels < 1 || in.Zeros < 0 {
		return invalid("LogMelDFT", "%d mels, %d zeros", in.Mels, in.Zeros)
	}
	var msg msgBuf
	st := C.dp_log_mel_dft(floatPtr(in.Samples), C.int64_t(len(in.Samples)), C.int64_t(in.Zeros), C.int32_t(in.Mels),
		floatPtr(dst), C.int64_t(len(dst)), msg.ptr(), msg.len())
	return errorOf("LogMelDFT", st, &msg)
}
