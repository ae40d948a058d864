/* dp_jpeg.c: JPEG header and RGB decoding through libjpeg-turbo's TurboJPEG API.
 *
 * TurboJPEG reports libjpeg errors through setjmp/longjmp inside the library and returns -1, so
 * nothing here can abort. Warnings (a truncated stream, corrupt data) stop decoding and are
 * errors: a partly grey picture must not reach an encoder. TJFLAG_LIMITSCANS refuses progressive
 * streams with absurd scan counts (a known denial of service). Without TJFLAG_FASTUPSAMPLE and
 * TJFLAG_FASTDCT the decode is libjpeg's default (accurate integer IDCT, fancy upsampling), the
 * one Pillow uses, so the pixels match Pillow's. A handle is created per call (a few KiB; far
 * cheaper than the decode). */
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
