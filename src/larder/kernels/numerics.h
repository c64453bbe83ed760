// numerics.h — an identity for the numbers a kernel table computes.
//
// The KV store promises that a prefix it serves is the prefix this binary would have computed
// (one answer per prompt). KV rows computed by other numerics — another ISA tier, another decode
// tile set, a kernel whose summation order or activation rounding changed in a later build —
// differ in the last bits, so an entry written by them must never be reused. A hand-kept version
// number would be forgotten; instead the fingerprint runs a fixed probe through the table (every
// matmul format and MLX affine width at decode and prefill token counts, the fused multi-matmul,
// attention over f32/f16/q8_0 KV, the norms, rope and activations) and hashes the output bits. The
// same binary on the same kind of CPU gives the same fingerprint; a numerics change that the probe
// reaches changes it. kNumericsRevision is for the rare change the probe cannot see (bump it).
#pragma once

#include <string>

#include "larder/kernels/dispatch.h"

namespace larder::kernels {

inline constexpr int kNumericsRevision = 1;

// "cpu:<tier>:<16 hex digits>" for table `t` (a few ms: small problems; results do not depend on
// the thread count, which the kernels guarantee and tests/unit/kernels_fast checks).
std::string numerics_fingerprint(const KernelTable& t);

// numerics_fingerprint(active_table()), computed once per active table (thread-safe).
std::string active_numerics_id();

}  // namespace larder::kernels
