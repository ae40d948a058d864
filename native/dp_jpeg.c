/* dp_jpeg.c: JPEG header and RGB decoding through libjpeg-turbo's TurboJPEG API.
 *
 * TurboJPEG reports libjpeg errors through setjmp/longjmp inside the library and returns -1, so
 * nothing here can abort. Warnings (a truncated stream, corrupt data) stop decoding and are
 * errors: a partly grey picture must not reach an encoder. TJFLAG_LIMITSCANS refuses progressive
 * streams with absurd scan counts (a known denial of service). Without TJFLAG_FASTUPSAMPLE and
 * TJFLAG_FASTDCT the decode is libjpeg's default (accurate integer IDCT, fancy upsampling), the
 * one Pillow uses, so the pixels match Pillow's. A handle is created per call (a few KiB; far
 * cheaper than the decode). */
#include <string.h>
#include <turbojpeg.h>

#include "dp_internal.h"
#include "dp_media.h"

static const int dp_tj_flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;

static dp_status tj_failure(tjhandle h, const char *what, char *msg, size_t msg_len) {
	const char *why = h ? tjGetErrorStr2(h) : "cannot create a TurboJPEG handle";
	int warning = h && tjGetErrorCode(h) == TJERR_WARNING;
	return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg %s: %s%s", what, warning ? "corrupt or truncated data: " : "", why);
}

static dp_status read_header(tjhandle h, const void *data, size_t len, dp_jpeg_info *info, char *msg, size_t msg_len) {
	if (data == NULL || len == 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg header: empty input");
	if (len > (size_t)0x7fffffff) return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg header: %zu bytes, limit 2 GiB", len);
	int w = 0, hh = 0, ss = 0, cs = 0;
	if (tjDecompressHeader3(h, data, (unsigned long)len, &w, &hh, &ss, &cs) != 0) return tj_failure(h, "header", msg, msg_len);
	if (w <= 0 || hh <= 0 || w > DP_IMAGE_MAX_SIDE || hh > DP_IMAGE_MAX_SIDE)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg header: bad dimensions %dx%d", w, hh);
	*info = (dp_jpeg_info){w, hh, ss, cs};
	return DP_OK;
}

dp_status dp_jpeg_header(const void *data, size_t len, dp_jpeg_info *info, char *msg, size_t msg_len) {
	if (info == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg header: null info");
	tjhandle h = tjInitDecompress();
	if (h == NULL) return tj_failure(h, "header", msg, msg_len);
	dp_status st = read_header(h, data, len, info, msg, msg_len);
	tjDestroy(h);
	return st;
}

dp_status dp_jpeg_decode_rgb(const void *data, size_t len, uint8_t *dst, size_t dst_len, int32_t width, int32_t height,
                             char *msg, size_t msg_len) {
	if (dst == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg decode: null destination");
	tjhandle h = tjInitDecompress();
	if (h == NULL) return tj_failure(h, "decode", msg, msg_len);
	dp_jpeg_info info = {0};
	dp_status st = read_header(h, data, len, &info, msg, msg_len);
	if (st == DP_OK && (info.width != width || info.height != height))
		st = dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg decode: header says %dx%d, caller expects %dx%d", info.width,
		             info.height, width, height);
	if (st == DP_OK && (info.colorspace == TJCS_CMYK || info.colorspace == TJCS_YCCK))
		st = dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "jpeg decode: CMYK/YCCK JPEG is not supported");
	if (st == DP_OK && dst_len < (size_t)width * (size_t)height * 3)
		st = dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg decode: destination holds %zu bytes, %dx%d RGB needs %zu", dst_len,
		             width, height, (size_t)width * (size_t)height * 3);
	if (st == DP_OK && tjDecompress2(h, data, (unsigned long)len, dst, width, width * 3, height, TJPF_RGB, dp_tj_flags) != 0)
		st = tj_failure(h, "decode", msg, msg_len);
	tjDestroy(h);
	return st;
}

/* ---- decode only the window a resize reads (libjpeg API) ----
 *
 * jpeg_crop_scanline decodes whole iMCU columns and jpeg_skip_scanlines skips rows without
 * colour conversion, upsampling or (for whole iMCU rows) the IDCT; entropy decoding still reads
 * the whole stream. At the edge of a cropped or skipped region fancy upsampling lacks the
 * neighbouring chroma a full decode uses, so the decoded window is widened by a margin of one
 * iMCU each side (clipped to the picture) and only the inside is used: those pixels are a full
 * decode's, bit for bit (tested against the full decode in native and picture tests). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>

#define DP_JPEG_MAX_SCANS 500 /* TurboJPEG's TJFLAG_LIMITSCANS limit */

typedef struct jerr {
	struct jpeg_error_mgr pub;
	jmp_buf jump;
	char why[JMSG_LENGTH_MAX];
	int warning;
} jerr;

static void jerr_exit(j_common_ptr c) {
	jerr *e = (jerr *)c->err;
	(*c->err->format_message)(c, e->why);
	longjmp(e->jump, 1);
}

/* Warnings (level -1: corrupt data, a truncated stream) stop the decode, as TJFLAG_STOPONWARNING. */
static void jerr_message(j_common_ptr c, int level) {
	if (level >= 0) return;
	jerr *e = (jerr *)c->err;
	e->warning = 1;
	(*c->err->format_message)(c, e->why);
	longjmp(e->jump, 1);
}

static void limit_scans(j_common_ptr c) {
	j_decompress_ptr d = (j_decompress_ptr)c;
	if (d->is_decompressor && d->input_scan_number > DP_JPEG_MAX_SCANS) {
		jerr *e = (jerr *)c->err;
		snprintf(e->why, sizeof e->why, "progressive JPEG with more than %d scans", DP_JPEG_MAX_SCANS);
		longjmp(e->jump, 1);
	}
}

dp_status dp_jpeg_resize(const void *data, size_t len, const dp_resize_job *job, int32_t isa, char *msg, size_t msg_len) {
	if (data == NULL || len == 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: empty input");
	if (len > (size_t)0x7fffffff) return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: %zu bytes, limit 2 GiB", len);
	if (job == NULL || job->channels != 3)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: the job must have 3 channels (RGB)");
	int32_t win[4];
	dp_status st = dp_resize_window(job, win, msg, msg_len);
	if (st != DP_OK) return st;

	struct jpeg_decompress_struct d;
	struct jpeg_progress_mgr progress = {.progress_monitor = limit_scans};
	jerr e = {0};
	uint8_t *volatile reg = NULL;
	d.err = jpeg_std_error(&e.pub);
	e.pub.error_exit = jerr_exit;
	e.pub.emit_message = jerr_message;
	if (setjmp(e.jump)) {
		st = dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: %s%s", e.warning ? "corrupt or truncated data: " : "", e.why);
		goto out;
	}
	jpeg_create_decompress(&d);
	d.progress = &progress;
	jpeg_mem_src(&d, (const unsigned char *)data, (unsigned long)len);
	jpeg_read_header(&d, TRUE);
	if ((int32_t)d.image_width != job->src_w || (int32_t)d.image_height != job->src_h) {
		st = dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: header says %ux%u, the job %dx%d", d.image_width,
		             d.image_height, job->src_w, job->src_h);
		goto out;
	}
	if (d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK) {
		st = dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "jpeg resize: CMYK/YCCK JPEG is not supported");
		goto out;
	}
	d.out_color_space = JCS_RGB; /* defaults otherwise: JDCT_ISLOW, fancy upsampling, as Pillow */
	jpeg_start_decompress(&d);
	int32_t mw = d.max_h_samp_factor * DCTSIZE, mh = d.max_v_samp_factor * DCTSIZE; /* one iMCU */
	int32_t x0 = win[0] - mw, x1 = win[2] + mw, y0 = win[1] - mh, y1 = win[3] + mh;
	if (x0 < 0) x0 = 0;
	if (y0 < 0) y0 = 0;
	if (x1 > job->src_w) x1 = job->src_w;
	if (y1 > job->src_h) y1 = job->src_h;
	JDIMENSION cx = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
	if (cw < d.output_width) jpeg_crop_scanline(&d, &cx, &cw); /* widens to whole iMCU columns */
	/* The decoder's rows are the region: columns [cx, cx + cw), rows [y0, y1). */
	int32_t rx = (int32_t)cx, rw = (int32_t)cw, ry = y0, rh = y1 - y0;
	const size_t bytes = (size_t)rw * 3;
	reg = malloc(bytes * (size_t)rh);
	if (reg == NULL) {
		st = dp_fail(msg, msg_len, DP_ERR_NOMEM, "jpeg resize: cannot allocate the %dx%d window", rw, rh);
		goto out;
	}
	if (y0 > 0 && jpeg_skip_scanlines(&d, (JDIMENSION)y0) != (JDIMENSION)y0) {
		st = dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: cannot skip %d rows", y0);
		goto out;
	}
	for (int32_t y = 0; y < rh;) {
		JSAMPROW rows[16];
		int32_t n = rh - y < 16 ? rh - y : 16;
		for (int32_t i = 0; i < n; i++) rows[i] = reg + (size_t)(y + i) * bytes;
		JDIMENSION got = jpeg_read_scanlines(&d, rows, (JDIMENSION)n);
		if (got == 0) {
			st = dp_fail(msg, msg_len, DP_ERR_INVALID, "jpeg resize: corrupt or truncated data: no row %d", y0 + y);
			goto out;
		}
		y += (int32_t)got;
	}
	st = dp_resize_region(job, reg, rx, ry, rw, rh, isa, msg, msg_len);
out:
	jpeg_destroy_decompress(&d); /* also ends an unfinished decode (rows not read) */
	free(reg);
	return st;
}
