#include "larder/kernels/dispatch.h"

#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {

namespace {

KernelTable make_ref_table() {
  KernelTable t;
  t.name = "ref";
  auto set = [&](DType d, DequantRowFn f) {
    t.dequant_row[static_cast<int>(d)] = f;
    t.matmul[static_cast<int>(d)] = ref::matmul;
  };
  set(DType::kF32, ref::dequant_row_f32);
  set(DType::kF16, ref::dequant_row_f16);
  set(DType::kBF16, ref::dequant_row_bf16);
  set(DType::kQ8_0, ref::dequant_row_q8_0);
  set(DType::kQ4_0, ref::dequant_row_q4_0);
  set(DType::kQ4_K, ref::dequant_row_q4_k);
  set(DType::kQ5_K, ref::dequant_row_q5_k);
  set(DType::kQ6_K, ref::dequant_row_q6_k);
  set(DType::kQ4_1, ref::dequant_row_q4_1);
  set(DType::kQ5_0, ref::dequant_row_q5_0);
  set(DType::kQ5_1, ref::dequant_row_q5_1);
  set(DType::kIQ4_NL, ref::dequant_row_iq4_nl);
  set(DType::kQ2_K, ref::dequant_row_q2_k);
  set(DType::kQ3_K, ref::dequant_row_q3_k);
  set(DType::kIQ4_XS, ref::dequant_row_iq4_xs);
  set(DType::kMXFP4, ref::dequant_row_mxfp4);
  set(DType::kMlxMXFP4, ref::dequant_row_mlx_mxfp4);
  set(DType::kMlxNVFP4, ref::dequant_row_mlx_nvfp4);
  set(DType::kMlxMXFP8, ref::dequant_row_mlx_mxfp8);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    t.matmul_affine[bits] = ref::matmul_affine;
    t.dequant_row_affine[bits] = ref::dequant_row_affine;
  }
  t.rmsnorm = ref::rmsnorm;
  t.rope = ref::rope;
  t.softmax = ref::softmax;
  t.silu_mul = ref::silu_mul;
  t.gelu_tanh_mul = ref::gelu_tanh_mul;
  t.swiglu_oai = ref::swiglu_oai;
  t.add = ref::add;
  t.to_f16 = ref::to_f16;
  t.attention = ref::attention;
  t.argmax = ref::argmax;
  t.sum_exp = ref::sum_exp;
  t.select_at_least = ref::select_at_least;
  t.causal_conv1d = ref::causal_conv1d;
  t.l2norm_heads = ref::l2norm_heads;
  t.gated_delta_gates = ref::gated_delta_gates;
  t.gated_delta_recurrent = ref::gated_delta_recurrent;
  t.gated_delta_chunked = ref::gated_delta_chunked;
  t.rmsnorm_gated = ref::rmsnorm_gated;
  t.route_topk = ref::route_topk;
  t.lora_delta = ref::lora_delta;
  return t;
}

KernelTable& active_storage() {
  // Faster tiers are layered on here (CPUID-checked), entry by entry, over the ref set:
  // kernels/cpu/common/register.cpp (AVX2 always; AVX-512 when CPUID reports the whole tier).
  static KernelTable t = [] {
    KernelTable k = ref_table();
    cpu::register_fast_kernels(k);
    return k;
  }();
  return t;
}

}  // namespace

const KernelTable& ref_table() {
  static const KernelTable t = make_ref_table();
  return t;
}

const KernelTable& active_table() { return active_storage(); }

void set_active_table(const KernelTable& t) { active_storage() = t; }

}  // namespace larder::kernels
