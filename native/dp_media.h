/*
 * dp_media.h: the media preprocessing kernels: JPEG decoding (libjpeg-turbo), Pillow-exact
 * resampling, EXIF orientation, normalisation to CHW tensors, the FFT, the Whisper log-mel
 * spectrogram and the audio resampler.
 *
 * Same rules as dp.h: every entry point returns a dp_status, writes a message into the caller's
 * buffer on failure, never aborts, and validates its arguments before the first store.
 *
 * Images are 8-bit, row-major, channels interleaved (HWC) and packed: a w x h image with c
 * channels is w*h*c bytes, row y starting at byte y*w*c.
 */
#ifndef DP_MEDIA_H
#define DP_MEDIA_H

#include "dp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest image side any kernel accepts (callers set their own, lower pixel limits). */
#define DP_IMAGE_MAX_SIDE 65535

/* ---- JPEG (libjpeg-turbo) ---- */

/* What the JPEG header says. subsamp and colorspace are TurboJPEG's TJSAMP_* / TJCS_* codes. */
typedef struct dp_jpeg_info {
	int32_t width;
	int32_t height;
	int32_t subsamp;
	int32_t colorspace;
} dp_jpeg_info;

/* dp_jpeg_header reads the frame header only (no pixels are decoded). */
dp_status dp_jpeg_header(const void *data, size_t len, dp_jpeg_info *info, char *msg, size_t msg_len);

/*
 * dp_jpeg_decode_rgb decodes to packed RGB, 3*width*height bytes in dst, as libjpeg does by
 * default (and so as Pillow does): accurate integer IDCT, "fancy" chroma upsampling. width and
 * height are what dp_jpeg_header returned; a stream whose header says otherwise is refused.
 * libjpeg warnings (a truncated or corrupt stream) are errors. CMYK/YCCK streams are
 * DP_ERR_UNSUPPORTED.
 */
dp_status dp_jpeg_decode_rgb(const void *data, size_t len, uint8_t *dst, size_t dst_len, int32_t width,
                             int32_t height, char *msg, size_t msg_len);

/* ---- resampling, Pillow's algorithm ---- */

typedef enum dp_filter {
	DP_FILTER_BILINEAR = 0, /* triangle, support 1 */
	DP_FILTER_BICUBIC = 1,  /* Keys a = -0.5, support 2 */
} dp_filter;

/*
 * A resize of src (src_w x src_h, channels 1..4) to out_w x out_h, of which only the window
 * [crop_x, crop_x + crop_w) x [crop_y, crop_y + crop_h) is written to dst (crop_w*crop_h*channels
 * bytes). Cropping after resizing this way gives the same bytes as resizing the whole image and
 * cropping it, without computing the pixels the crop drops.
 */
typedef struct dp_resize_job {
	const uint8_t *src;
	int32_t src_w, src_h, channels;
	int32_t out_w, out_h;
	int32_t crop_x, crop_y, crop_w, crop_h;
	uint8_t *dst;
	int32_t filter; /* dp_filter */
} dp_resize_job;

/*
 * dp_resize runs Pillow's ImagingResample exactly (Pillow 9.x, box = the whole image):
 * separable, the horizontal pass first; per output pixel center = (i + 0.5) * scale, support =
 * filter support * max(scale, 1), taps [int(center - support + 0.5), int(center + support + 0.5))
 * clipped to the image, weights filter((x - center + 0.5) / max(scale, 1)) normalised to sum 1
 * and then rounded to 22-bit fixed point; each pass accumulates from 2^21, shifts by 22 and clips
 * to 0..255 (the intermediate image is 8-bit). A pass whose size does not change is skipped, as
 * Pillow does. The intermediate image is allocated here (DP_ERR_NOMEM if that fails).
 */
dp_status dp_resize(const dp_resize_job *job, int32_t isa, char *msg, size_t msg_len);

/*
 * dp_jpeg_resize decodes a JPEG (job->src_w x job->src_h, from dp_jpeg_header) and resizes it as
 * dp_resize does, job->channels 3; job->src is not read. Only the source window the cropped
 * output needs is decoded (columns through jpeg_crop_scanline, rows through
 * jpeg_skip_scanlines), widened by one iMCU each side so that fancy upsampling sees what a full
 * decode sees: the bytes are dp_jpeg_decode_rgb + dp_resize's. Errors as dp_jpeg_decode_rgb.
 */
dp_status dp_jpeg_resize(const void *data, size_t len, const dp_resize_job *job, int32_t isa, char *msg, size_t msg_len);

/* ---- orientation and normalisation ---- */

/*
 * dp_image_orient applies an EXIF orientation (1..8) to src (w x h, channels 1..4) into dst, as
 * Pillow's ImageOps.exif_transpose does: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate
 * 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise. For 5..8 dst is h x w. dst and src
 * must not overlap.
 */
dp_status dp_image_orient(const uint8_t *src, int32_t w, int32_t h, int32_t channels, int32_t orientation, uint8_t *dst,
                          char *msg, size_t msg_len);

/*
 * dp_image_normalize turns a packed 3-channel image into a CHW tensor of dtype (DP_F32, DP_F16,
 * DP_BF16): value = ((float)v / divisor - mean[c]) / std[c], each step rounded in binary32 as
 * torchvision's ToTensor + Normalize do (so divisor 255 reproduces them bit for bit), then
 * rounded to dtype (nearest, ties to even). dst holds 3*w*h elements. Every variant gives the same
 * bits.
 */
dp_status dp_image_normalize(const uint8_t *src, int32_t w, int32_t h, const float mean[3], const float std[3],
                             float divisor, void *dst, int32_t dtype, int32_t isa, char *msg, size_t msg_len);

/* ---- FFT ---- */

/* dp_fft_supported reports whether n (> 0) is a product of 2, 3 and 5: the sizes dp_fft runs. */
int dp_fft_supported(int32_t n);

/*
 * dp_fft computes the forward DFT X[k] = sum_j x[j] exp(-2 pi i j k / n) of n complex values
 * (separate real and imaginary arrays) in place, with a mixed-radix (2, 3, 4, 5) Stockham FFT.
 * n must satisfy dp_fft_supported and be at most DP_FFT_MAX.
 */
#define DP_FFT_MAX 4096
dp_status dp_fft(float *re, float *im, int32_t n, char *msg, size_t msg_len);

/*
 * dp_rfft computes the first n/2 + 1 bins of the DFT of n real values (n even, n/2 as for
 * dp_fft) through one complex FFT of n/2 points.
 */
dp_status dp_rfft(const float *x, int32_t n, float *re, float *im, char *msg, size_t msg_len);

/* ---- Whisper log-mel ---- */

#define DP_WHISPER_N_FFT 400
#define DP_WHISPER_HOP 160
#define DP_WHISPER_SAMPLE_RATE 16000

/*
 * dp_mel_filters writes librosa's Slaney mel filter bank, mel(sr, n_fft, n_mels, fmin 0,
 * fmax sr/2, htk False, norm "slaney"), as float32 [n_mels, n_fft/2 + 1], computed in double and
 * rounded once. 1 <= n_mels <= 512, 2 <= n_fft <= DP_FFT_MAX, n_fft even.
 */
dp_status dp_mel_filters(int32_t n_mels, int32_t n_fft, int32_t sample_rate, float *dst, char *msg, size_t msg_len);

/*
 * dp_log_mel computes Whisper's log-mel spectrogram of the signal samples[0, n_samples) followed
 * by n_zeros zeros (the padding Whisper appends), N = n_samples + n_zeros >= 201:
 * STFT with a periodic Hann window of 400, hop 160, centred frames (reflect padding of 200 at
 * both ends), the last frame dropped, so n_frames = N / 160; power |X|^2; the Slaney mel filters;
 * log10(max(x, 1e-10)); x = max(x, max over all frames - 8); (x + 4) / 4.
 * dst is [n_mels, n_frames] float32 (mel bin major, frames contiguous), dst_len its element
 * count; *max_out (may be NULL) receives the log10 maximum. Frames are split over up to
 * n_threads threads.
 */
dp_status dp_log_mel(const float *samples, int64_t n_samples, int64_t n_zeros, int32_t n_mels, float *dst,
                     int64_t dst_len, float *max_out, int32_t n_threads, int32_t isa, char *msg, size_t msg_len);

/*
 * dp_log_mel_dft is dp_log_mel done the straightforward way, for benchmarks and cross-checks:
 * one thread, a dense 400 x 201 DFT matrix product per frame, libm's log10f.
 */
dp_status dp_log_mel_dft(const float *samples, int64_t n_samples, int64_t n_zeros, int32_t n_mels, float *dst,
                         int64_t dst_len, char *msg, size_t msg_len);

/* dp_log_mel_frames is the frame count dp_log_mel writes for N samples in all (N / 160). */
int64_t dp_log_mel_frames(int64_t n_total);

/* ---- resampling audio ---- */

/*
 * dp_resample_len is the output length for n input samples: ceil(n * rate_out / rate_in).
 * Returns -1 for rates outside [1, DP_RESAMPLE_MAX_RATE] or a length that would overflow.
 */
#define DP_RESAMPLE_MAX_RATE 768000
int64_t dp_resample_len(int64_t n, int32_t rate_in, int32_t rate_out);

/*
 * dp_resample converts mono float samples from rate_in to rate_out with a Kaiser-windowed sinc
 * (beta 9; 32 zero crossings' worth of taps at the lower of the two rates; cutoff 0.97 of the
 * lower Nyquist), the parameters of ffmpeg's libswresample default. Output sample k is the
 * filtered signal at input time k * rate_in / rate_out; samples outside the input are zeros. The
 * filter has one phase per output position when the reduced ratio's denominator is at most
 * 1024; otherwise 1024 phases, interpolated linearly. dst holds dp_resample_len(...) samples.
 */
dp_status dp_resample(const float *src, int64_t n_src, int32_t rate_in, int32_t rate_out, float *dst, int64_t dst_len,
                      int32_t isa, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif /* DP_MEDIA_H */
