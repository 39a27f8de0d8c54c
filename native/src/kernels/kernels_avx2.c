/* AVX2 + FMA + F16C kernels (x86-64 since Haswell / Zen). Built with -mavx2 -mfma -mf16c and only
 * called after cpuid said yes. The kernels themselves are in kernels_x86_common.h. */
#include "kernels_x86_common.h"

void pi2_kernels_fill_avx2(pi2_kernel_table *t) { x86_fill(t); }
