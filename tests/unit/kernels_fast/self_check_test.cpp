// The startup self-check that guards the AVX-512 tier (which CI machines without AVX-512 never
// execute): it must accept a correct kernel and reject a subtly wrong one.
#include <gtest/gtest.h>

#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"

namespace larder::kernels::cpu {
namespace {

MatmulFn g_ref = nullptr;

// A kernel with a "lane bug": the result for one output row comes from its neighbour.
void off_by_one_row(const WeightView& w, const float* x, int64_t n, float* y) {
  g_ref(w, x, n, y);
  for (int64_t t = 0; t < n; ++t) y[t * w.rows + 5] = y[t * w.rows + 6];
}

TEST(FastKernelSelfCheck, AcceptsAvx2AgainstReferenceAndRejectsABrokenKernel) {
  for (DType d : {DType::kQ8_0, DType::kQ4_0, DType::kBF16}) {
    MatmulFn ref = ref_table().matmul[static_cast<int>(d)];
    MatmulFn avx2 = fast_matmul("avx2", d);
    ASSERT_NE(ref, nullptr);
    ASSERT_NE(avx2, nullptr);
    EXPECT_TRUE(fast_matmul_agrees(d, ref, ref)) << dtype_name(d);
    EXPECT_TRUE(fast_matmul_agrees(d, avx2, ref)) << dtype_name(d);
    g_ref = ref;
    EXPECT_FALSE(fast_matmul_agrees(d, off_by_one_row, ref)) << dtype_name(d);
  }
}

TEST(FastKernelSelfCheck, AffineAcceptsAvx2AndRejectsABrokenKernel) {
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    MatmulFn ref = ref_table().matmul_affine[bits];
    MatmulFn avx2 = fast_matmul_affine("avx2", bits);
    ASSERT_NE(ref, nullptr);
    ASSERT_NE(avx2, nullptr);
    EXPECT_TRUE(fast_matmul_affine_agrees(bits, avx2, ref)) << bits;
    g_ref = ref;
    EXPECT_FALSE(fast_matmul_affine_agrees(bits, off_by_one_row, ref)) << bits;
  }
}

}  // namespace
}  // namespace larder::kernels::cpu
