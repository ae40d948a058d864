/* dp_cpu.c: which kernel variants this CPU and OS can run, decided once. */
#include <pthread.h>

#include "dp_internal.h"

#if DP_X86
#include <cpuid.h>

static int avx2_usable, avx512_usable, avx512vbmi_usable;

static uint32_t xcr0(void) {
	uint32_t eax, edx;
	__asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
	(void)edx;
	return eax;
}

static void detect(void) {
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d)) return;
	int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1, fma = (c >> 12) & 1;
	/* XCR0: SSE (bit 1) and AVX (bit 2) state for YMM; opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7). */
	if (!(osxsave && avx && f16c && fma) || (xcr0() & 0x6u) != 0x6u) return;
	if (__get_cpuid_max(0, 0) < 7) return;
	__cpuid_count(7, 0, a, b, c, d);
	avx2_usable = (b >> 5) & 1;
	int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
	avx512_usable = avx2_usable && f && dq && bw && vl && (xcr0() & 0xE6u) == 0xE6u;
	avx512vbmi_usable = avx512_usable && ((c >> 1) & 1);
}
#else
static const int avx2_usable = 0, avx512_usable = 0, avx512vbmi_usable = 0;
static void detect(void) {}
#endif

static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

int dp_isa_supported(int32_t isa) {
	pthread_once(&detect_once, detect);
	switch (isa) {
	case DP_ISA_GENERIC: return 1;
	case DP_ISA_AVX2: return avx2_usable;
	case DP_ISA_AVX512: return avx512_usable;
	default: return 0;
	}
}

int dp_avx512vbmi_usable(void) {
	pthread_once(&detect_once, detect);
	return avx512vbmi_usable;
}

int32_t dp_isa_best(void) {
	for (int32_t isa = DP_ISA_COUNT - 1; isa > DP_ISA_GENERIC; isa--)
		if (dp_isa_supported(isa)) return isa;
	return DP_ISA_GENERIC;
}

int32_t dp_isa_resolve(int32_t isa) {
	if (isa == DP_ISA_AUTO) return dp_isa_best();
	return dp_isa_supported(isa) ? isa : -1;
}
