// The kernels' shared ground: the headers every part uses (Arm's NEON intrinsics where the target has them),
// the input check, the work grain and a vectorizable exp. Every part (*.h) includes it; compiled in
// fused.cpp's one translation unit.
#pragma once

#if defined(QUICKDRAFT_NO_TORCH)  // the int8 tiles alone, cross-built and checked without torch
#include "torch_free.h"           // (scripts/arm/: at::parallel_for and c10::Half's stand-ins)
#else
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace {

constexpr int64_t kGrain = 1 << 16;  // elements of work below which a loop stays on one thread

#if !defined(QUICKDRAFT_NO_TORCH)
using at::Tensor;

// Every tensor a kernel indexes is checked first (a clear error to Python, never a read out of bounds):
// on the CPU, of the dtype the kernel reads it as, contiguous, with the dimensions it indexes.
inline void check_input(const Tensor& t, const char* what, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK(t.defined() && t.device().is_cpu(), what, ": expected a CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, what, ": dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.dim() == dim && t.is_contiguous(), what, ": expected a contiguous ", dim, "-d tensor, got ", t.sizes());
}
#endif

// exp for float, branch-free so loops over it vectorize (Cephes' expf: range reduction by ln 2 split
// in two, a degree-6 polynomial, 2^n from the exponent bits; about 1 ulp). Doubles take std::exp.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

}  // namespace
