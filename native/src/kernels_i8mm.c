/* arm64 with int8 matrix multiply (SMMLA, ARMv8.6: Cortex-A510/A710/X2 and later). Same as the
 * dotprod level, built with +i8mm. */
#include "kernels_arm_common.h"

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "kernels_i8mm.c must be built with +i8mm (see native/CMakeLists.txt)"
#endif

void pi2_kernels_fill_i8mm(pi2_kernel_table *t) { arm_fill(t); }
