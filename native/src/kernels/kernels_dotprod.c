/* arm64 with the dot product extension (SDOT, ARMv8.2+: Cortex-A55/A76 and later). Built with
 * +dotprod, so dot16() in kernels_arm_common.h becomes vdotq_s32. */
#include "kernels_arm_common.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "kernels_dotprod.c must be built with +dotprod (see native/CMakeLists.txt)"
#endif

void pi2_kernels_fill_dotprod(pi2_kernel_table *t) { arm_fill(t); }
