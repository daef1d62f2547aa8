// pack_bf16 / linear_packed: bf16 linears over a packed weight (AVX512-BF16's vdpbf16ps where present).
// Python: runtime/kernels/linear.py.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "common.h"

namespace {

// ---- packed bf16 linears: y = x W^T with W streamed once, no horizontal sums --------------------------
// pack_bf16 lays a (N, K) weight out as (N/16, K/2, 16, 2): for each block of 16 outputs, every pair of
// input columns is 16 x 2 contiguous bf16 (the VNNI pairing), so one vdpbf16ps multiplies a broadcast
// pair of x by 16 outputs' weights and accumulates into 16 lanes that are 16 outputs: no horizontal
// reduction, each weight byte read once per block of 4 rows, blocks streamed sequentially. fp32
// accumulation, one rounding to bf16 (as torch's bf16 GEMM). Without AVX512-BF16 the same layout is
// read by a loop the compiler vectorizes for the host (AVX2, AVX-512F): bf16 -> float by a shift.

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even (NaN kept a NaN)
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

constexpr int kBlock = 16;  // outputs per packed block

// MB rows of x (row stride xs, K2 = K/2 column pairs) times NB blocks (block stride bs elements) into
// y (row stride ys), at the first output of the first block.
template <int MB, int NB>
inline void packed_tile(const uint16_t* x, int64_t xs, int64_t K2, const uint16_t* w, int64_t bs, uint16_t* y,
                        int64_t ys) {
#if defined(__AVX512BF16__)
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    __m512bh wv[NB];
    for (int n = 0; n < NB; ++n) wv[n] = (__m512bh)_mm512_loadu_si512(w + n * bs + k * 2 * kBlock);
    for (int m = 0; m < MB; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * xs + 2 * k, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, wv[n]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ys + n * kBlock), (__m256i)_mm512_cvtneps_pbh(acc[m][n]));
#elif defined(__AVX2__)
  // a 32-bit lane holds one output's pair of bf16 weights: the first is its bits shifted up 16, the
  // second its bits with the low 16 cleared; two fused multiply-adds a pair, 8 outputs a register
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  __m256 acc[MB][NB][2];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) acc[m][n][0] = acc[m][n][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    __m256 x0[MB], x1[MB];
    for (int m = 0; m < MB; ++m) {
      x0[m] = _mm256_set1_ps(bf16_to_float(x[m * xs + 2 * k]));
      x1[m] = _mm256_set1_ps(bf16_to_float(x[m * xs + 2 * k + 1]));
    }
    for (int n = 0; n < NB; ++n)
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + n * bs + k * 2 * kBlock + 16 * h));
        const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), w1 = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        for (int m = 0; m < MB; ++m) acc[m][n][h] = _mm256_fmadd_ps(x1[m], w1, _mm256_fmadd_ps(x0[m], w0, acc[m][n][h]));
      }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) {
      alignas(32) float tmp[kBlock];
      _mm256_store_ps(tmp, acc[m][n][0]);
      _mm256_store_ps(tmp + 8, acc[m][n][1]);
      for (int i = 0; i < kBlock; ++i) y[m * ys + n * kBlock + i] = float_to_bf16(tmp[i]);
    }
#else
  float acc[MB][NB][kBlock] = {};
  for (int64_t k = 0; k < K2; ++k) {
    for (int m = 0; m < MB; ++m) {
      const float x0 = bf16_to_float(x[m * xs + 2 * k]), x1 = bf16_to_float(x[m * xs + 2 * k + 1]);
      for (int n = 0; n < NB; ++n) {
        const uint16_t* wk = w + n * bs + k * 2 * kBlock;
        for (int i = 0; i < kBlock; ++i)
          acc[m][n][i] += x0 * bf16_to_float(wk[2 * i]) + x1 * bf16_to_float(wk[2 * i + 1]);
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n)
      for (int i = 0; i < kBlock; ++i) y[m * ys + n * kBlock + i] = float_to_bf16(acc[m][n][i]);
#endif
}

template <int NB>
inline void packed_rows(const uint16_t* x, int64_t M, int64_t xs, int64_t K2, const uint16_t* w, int64_t bs,
                        uint16_t* y, int64_t ys) {
  int64_t m = 0;
#if defined(__AVX2__) && !defined(__AVX512BF16__)
  if constexpr (NB <= 2) {  // AVX2's 16 registers: tiles of 2 rows (8 accumulators, 4 broadcasts)
    for (; m + 2 <= M; m += 2) packed_tile<2, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys);
  }
#endif
  for (; m + 4 <= M; m += 4) packed_tile<4, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys);
  switch (M - m) {
    case 3: packed_tile<3, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys); break;
    case 2: packed_tile<2, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys); break;
    case 1: packed_tile<1, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys); break;
    default: break;
  }
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// (N, K) bf16 -> (ceil(N/16), ceil(K/2), 16, 2) bf16, zero-padded
Tensor pack_bf16(const Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pack_bf16: a (N, K) bf16 CPU weight");
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t NBk = (N + kBlock - 1) / kBlock, K2 = (K + 1) / 2;
  const Tensor w = weight.contiguous();
  Tensor out = at::zeros({NBk, K2, kBlock, 2}, weight.options());
  const uint16_t* W = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  uint16_t* O = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  // each 16 outputs' (K2, 16, 2) block is written by one thread, row by row (a permuted copy through
  // torch took 2 ms a 576 x 1536 weight: a fifth of loading the default model)
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nb = begin; nb < end; ++nb)
      for (int64_t o = 0; o < kBlock && nb * kBlock + o < N; ++o) {
        const uint16_t* row = W + (nb * kBlock + o) * K;
        uint16_t* dst = O + nb * K2 * 2 * kBlock + 2 * o;
        for (int64_t k = 0; k < K; ++k) dst[(k >> 1) * 2 * kBlock + (k & 1)] = row[k];
      }
  });
  return out;
}

// x (M, K) bf16, packed from pack_bf16 of a (N, K) weight -> (M, N) bf16
Tensor linear_packed(const Tensor& x, const Tensor& packed, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16, "linear_packed: bf16 CPU rows");
  check_input(packed, "linear_packed: packed", at::kBFloat16, 4);
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), K2 = packed.size(1);
  TORCH_CHECK(packed.size(2) == kBlock && packed.size(3) == 2, "linear_packed: not a pack_bf16 layout");
  TORCH_CHECK((K + 1) / 2 == K2 && N >= 0 && N <= NBk * kBlock, "linear_packed: x does not match the packed weight");
  Tensor xc = x.contiguous();
  if (K % 2) xc = at::constant_pad_nd(xc, {0, 1});
  const int64_t xs = xc.size(1);
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint16_t* X = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const uint16_t* W = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  uint16_t* Y = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t bs = K2 * 2 * kBlock, ys = NBk * kBlock;
#if defined(__AVX2__) && !defined(__AVX512BF16__)
  constexpr int NB = 2;  // AVX2: 2 blocks of 16 outputs a tile
#else
  constexpr int NB = 4;
#endif
  const int64_t groups = (NBk + NB - 1) / NB;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = g * NB, nb = std::min<int64_t>(NB, NBk - b0);
      const uint16_t* w = W + b0 * bs;
      uint16_t* out = Y + b0 * kBlock;
      switch (nb) {
        case 4: packed_rows<std::min(4, NB)>(X, M, xs, K2, w, bs, out, ys); break;
        case 3: packed_rows<std::min(3, NB)>(X, M, xs, K2, w, bs, out, ys); break;
        case 2: packed_rows<std::min(2, NB)>(X, M, xs, K2, w, bs, out, ys); break;
        default: packed_rows<1>(X, M, xs, K2, w, bs, out, ys); break;
      }
    }
  });
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}
#endif

}  // namespace
