/* arm64 baseline (ARMv8.0 Advanced SIMD): every arm64 core, e.g. Cortex-A53. */
#include "kernels_arm_common.h"

void pi2_kernels_fill_neon(pi2_kernel_table *t) { arm_fill(t); }
