// pack_int8 / pack_blocks / linear_w8a8 / linear_w8a8_min: int8 weights x int8 activations in blocks of 32
// (VNNI where present), with an optional float min per half-block (w = s q + mn: GGUF's Q5_1, Q5_K, Q2_K
// codes as stored). Python: runtime/quant/w8a8.py. The rows' quantization: int8_rows.h.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "int8_rows.h"

namespace {

// ---- int8 weights x int8 activations in blocks of 32 (W8A8, as llama.cpp's Q8_0 x Q8_0) on VNNI -------
// Weights: int8 with one float scale per output and block of 32 inputs, stored shifted by 128 (unsigned);
// activations: quantized per row and block of 32 on the fly (absmax / 127, signed). pack_int8 lays the
// weights out as (N/16, K/4, 16, 4): one vpdpbusd multiplies 16 outputs' unsigned weight quads by a
// broadcast quad of signed activations (64 multiply-adds an instruction, twice bf16's, at half its
// weight bytes). Each block's int32 sums lose the shift with the activations' block sum (one scalar per
// row and block), then are converted and scaled:
// y[m, n] = sum_b s_x[m, b] s_w[n, b] (sum_{k in b} (q + 128) x_q - 128 sum_{k in b} x_q).
// With mins (Min): + sum_b s_x[m, b] (mn[n, 2b] sum_{first 16} x_q + mn[n, 2b + 1] sum_{last 16} x_q).
constexpr int64_t kW8Ahead = 12 * kQBlock * kBlock;  // bytes fetched ahead of the block being multiplied

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
Tensor pack_int8(const Tensor& q) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 2 && q.scalar_type() == at::kChar, "pack_int8: a (N, K) int8 CPU weight");
  const int64_t N = q.size(0), K = q.size(1);
  const int64_t NBk = (N + kBlock - 1) / kBlock, Kp = (K + kQBlock - 1) / kQBlock * kQBlock;
  Tensor padded = at::full({NBk * kBlock, Kp}, -128, q.options());  // padding: weight 0 once shifted
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(q);
  Tensor shifted = (padded.to(at::kInt) + 128).to(at::kByte);
  return shifted.view({NBk, kBlock, Kp / 4, 4}).permute({0, 2, 1, 3}).contiguous();
}

// (N, K/32) per-block values -> (N/16, K/32, 16), zero-padded rows (scales and column sums)
Tensor pack_blocks(const Tensor& v) {
  TORCH_CHECK(v.device().is_cpu() && v.dim() == 2, "pack_blocks: (N, blocks) CPU values");
  const int64_t N = v.size(0), B = v.size(1), NBk = (N + kBlock - 1) / kBlock;
  Tensor padded = at::zeros({NBk * kBlock, B}, v.options());
  padded.narrow(0, 0, N).copy_(v);
  return padded.view({NBk, kBlock, B}).permute({0, 2, 1}).contiguous();
}
#endif

// Min: w = s q + mn with mn per output and half-block (wm: a tile of 16 outputs' mins, (2 KB, 16) at stride ms
// from one tile to the next; xh: the rows' half-block sums, stride 2 sxs)
struct Mins {
  const float* wm = nullptr;
  int64_t ms = 0;
  const int32_t* xh = nullptr;
};

template <int MB, int NB, bool Min, typename out_t>
inline void w8a8_tile(const int8_t* x, int64_t xs, int64_t KB, const uint8_t* w, int64_t bs, const float* ws,
                      int64_t ss, const float* sx, const int32_t* xc, int64_t sxs, out_t* y, int64_t ys, Mins mn) {
#if defined(__AVX512VNNI__)
  __m512 facc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) facc[m][n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    __m512i acc[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_si512();
    if constexpr (MB > 1)  // several rows compute longer than the block's bytes take to arrive: fetch ahead
      for (int n = 0; n < NB; ++n)
        for (int l = 0; l < kQBlock * kBlock; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(w + n * bs + b * kQBlock * kBlock + kW8Ahead + l), _MM_HINT_T0);
    for (int64_t k = b * (kQBlock / 4); k < (b + 1) * (kQBlock / 4); ++k) {
      __m512i wv[NB];
      for (int n = 0; n < NB; ++n) wv[n] = _mm512_loadu_si512(w + n * bs + k * 4 * kBlock);
      for (int m = 0; m < MB; ++m) {
        int32_t quad;
        std::memcpy(&quad, x + m * xs + 4 * k, sizeof quad);
        const __m512i xv = _mm512_set1_epi32(quad);
        for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], wv[n], xv);
      }
    }
    for (int n = 0; n < NB; ++n) {
      const __m512 scale = _mm512_loadu_ps(ws + n * ss + b * kBlock);
      for (int m = 0; m < MB; ++m) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m][n], _mm512_set1_epi32(xc[m * sxs + b])));
        facc[m][n] = _mm512_fmadd_ps(v, _mm512_mul_ps(scale, _mm512_set1_ps(sx[m * sxs + b])), facc[m][n]);
        if constexpr (Min)
          for (int h = 0; h < 2; ++h)
            facc[m][n] = _mm512_fmadd_ps(_mm512_loadu_ps(mn.wm + n * mn.ms + (2 * b + h) * kBlock),
                                         _mm512_set1_ps(sx[m * sxs + b] * mn.xh[m * 2 * sxs + 2 * b + h]), facc[m][n]);
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) store16(facc[m][n], y + m * ys + n * kBlock);
#elif defined(__AVX2__)
  // weights q + 128 -> q (xor 128) -> |q| times x with q's sign: pairs within int16 (|q| <= 128, |x| <= 127)
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 facc[MB][NB][2];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) facc[m][n][0] = facc[m][n][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    __m256i acc[MB][NB][2];
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NB; ++n) acc[m][n][0] = acc[m][n][1] = _mm256_setzero_si256();
    for (int64_t k = b * (kQBlock / 4); k < (b + 1) * (kQBlock / 4); ++k) {
      __m256i wq[NB][2], wa[NB][2];
      for (int n = 0; n < NB; ++n)
        for (int h = 0; h < 2; ++h) {
          wq[n][h] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + n * bs + k * 4 * kBlock + 32 * h)), flip);
          wa[n][h] = _mm256_sign_epi8(wq[n][h], wq[n][h]);
        }
      for (int m = 0; m < MB; ++m) {
        const __m256i xv = bcast4(x + m * xs + 4 * k);
        for (int n = 0; n < NB; ++n)
          for (int h = 0; h < 2; ++h)
            acc[m][n][h] = dot_quads(acc[m][n][h], wa[n][h], _mm256_sign_epi8(xv, wq[n][h]));
      }
    }
    for (int n = 0; n < NB; ++n)
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_loadu_ps(ws + n * ss + b * kBlock + 8 * h);
        for (int m = 0; m < MB; ++m) {  // the sums are q x already: the VNNI path's shift is not there to take back
          const __m256 v = _mm256_cvtepi32_ps(acc[m][n][h]);
          facc[m][n][h] = _mm256_fmadd_ps(v, _mm256_mul_ps(scale, _mm256_set1_ps(sx[m * sxs + b])), facc[m][n][h]);
          if constexpr (Min)
            for (int j = 0; j < 2; ++j)
              facc[m][n][h] = _mm256_fmadd_ps(_mm256_loadu_ps(mn.wm + n * mn.ms + (2 * b + j) * kBlock + 8 * h),
                                              _mm256_set1_ps(sx[m * sxs + b] * mn.xh[m * 2 * sxs + 2 * b + j]), facc[m][n][h]);
        }
      }
  }
  (void)xc;
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) store16(facc[m][n][0], facc[m][n][1], y + m * ys + n * kBlock);
#elif defined(__ARM_FEATURE_DOTPROD)
  // each group of 16 outputs in turn (their accumulators fit the 32 registers), its weights' sign moved
  // back (q + 128 xor 128 = q): the sums are q x already, as AVX2's
  (void)xc;
  const uint8x16_t flip = vdupq_n_u8(0x80);
  for (int n = 0; n < NB; ++n) {
    float32x4_t facc[MB][4];
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < 4; ++v) facc[m][v] = vdupq_n_f32(0.f);
    for (int64_t b = 0; b < KB; ++b) {
      int32x4_t acc[MB][4];
      for (int m = 0; m < MB; ++m)
        for (int v = 0; v < 4; ++v) acc[m][v] = vdupq_n_s32(0);
      for (int h = 0; h < 2; ++h) {  // the block's two halves of 16 inputs: 4 quads each
        int8x16_t q[4][4];
        for (int j = 0; j < 4; ++j)
          for (int v = 0; v < 4; ++v)
            q[j][v] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + n * bs + (8 * b + 4 * h + j) * 4 * kBlock + 16 * v), flip));
        dot16x16<MB>(q, x + 32 * b + 16 * h, xs, acc);
      }
      for (int v = 0; v < 4; ++v) {
        const float32x4_t scale = vld1q_f32(ws + n * ss + b * kBlock + 4 * v);
        for (int m = 0; m < MB; ++m) {
          facc[m][v] = vfmaq_f32(facc[m][v], vcvtq_f32_s32(acc[m][v]), vmulq_n_f32(scale, sx[m * sxs + b]));
          if constexpr (Min)
            for (int j = 0; j < 2; ++j)
              facc[m][v] = vfmaq_f32(facc[m][v], vld1q_f32(mn.wm + n * mn.ms + (2 * b + j) * kBlock + 4 * v),
                                     vdupq_n_f32(sx[m * sxs + b] * mn.xh[m * 2 * sxs + 2 * b + j]));
        }
      }
    }
    for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys + n * kBlock);
  }
#else
  float facc[MB][NB][kBlock] = {};
  for (int64_t b = 0; b < KB; ++b)
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NB; ++n) {
        int32_t acc[kBlock] = {};
        for (int64_t k = b * (kQBlock / 4); k < (b + 1) * (kQBlock / 4); ++k) {
          const int8_t* xk = x + m * xs + 4 * k;
          const uint8_t* wk = w + n * bs + k * 4 * kBlock;
          for (int i = 0; i < kBlock; ++i)
            for (int j = 0; j < 4; ++j) acc[i] += static_cast<int32_t>(xk[j]) * static_cast<int32_t>(wk[4 * i + j]);
        }
        for (int i = 0; i < kBlock; ++i) {  // the vector paths' fused multiply-adds, in their order
          facc[m][n][i] = std::fma(static_cast<float>(acc[i] - xc[m * sxs + b]), ws[n * ss + b * kBlock + i] * sx[m * sxs + b],
                                   facc[m][n][i]);
          if constexpr (Min)
            for (int j = 0; j < 2; ++j)
              facc[m][n][i] = std::fma(mn.wm[n * mn.ms + (2 * b + j) * kBlock + i],
                                       sx[m * sxs + b] * static_cast<float>(mn.xh[m * 2 * sxs + 2 * b + j]), facc[m][n][i]);
        }
      }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) store16(facc[m][n], y + m * ys + n * kBlock);
#endif
}

template <int NB, bool Min, typename out_t>
inline void w8a8_rows(const int8_t* x, int64_t M, int64_t xs, int64_t KB, const uint8_t* w, int64_t bs,
                      const float* ws, int64_t ss, const float* sx, const int32_t* xc, int64_t sxs, out_t* y,
                      int64_t ys, Mins mn) {
  const auto at = [&](int64_t m) { return Mins{mn.wm, mn.ms, mn.xh == nullptr ? nullptr : mn.xh + m * 2 * sxs}; };
#if !defined(__AVX512VNNI__)
  if (M > 1) {  // 16 registers (AVX2): tiles of 2 rows
    int64_t m = 0;
    for (; m + 2 <= M; m += 2)
      w8a8_tile<2, NB, Min>(x + m * xs, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys, at(m));
    if (m < M) w8a8_tile<1, NB, Min>(x + m * xs, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys, at(m));
    return;
  }
#endif
  if (M == 5 || M == 6) {  // one pass over the weights (24 accumulators and the weights fit the 32 registers)
    if (M == 5) w8a8_tile<5, NB, Min>(x, xs, KB, w, bs, ws, ss, sx, xc, sxs, y, ys, at(0));
    else w8a8_tile<6, NB, Min>(x, xs, KB, w, bs, ws, ss, sx, xc, sxs, y, ys, at(0));
    return;
  }
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    w8a8_tile<4, NB, Min>(x + m * xs, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys, at(m));
  const int64_t r = M - m;
  const int8_t* xr = x + m * xs;
  if (r == 3) w8a8_tile<3, NB, Min>(xr, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys, at(m));
  if (r == 2) w8a8_tile<2, NB, Min>(xr, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys, at(m));
  if (r == 1) w8a8_tile<1, NB, Min>(xr, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys, at(m));
}

template <bool Min, typename out_t>
void w8a8_run(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* WS,
              const float* SX, const int32_t* XC, const int32_t* XH, out_t* Y, int64_t NBk) {
  constexpr int NB = 2;
  // scales (Min: then the mins) of a tile of 16 outputs: KB x 16 floats (Min: 3 KB x 16)
  const int64_t bs = KB * kQBlock * kBlock, ss = (Min ? 3 : 1) * KB * kBlock, ys = NBk * kBlock;
  const int64_t groups = (NBk + NB - 1) / NB;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = g * NB;
      const uint8_t* w = W + b0 * bs;
      const float* ws = WS + b0 * ss;
      const Mins mn{Min ? ws + KB * kBlock : nullptr, ss, XH};
      out_t* out = Y + b0 * kBlock;
      if (NBk - b0 >= 2) w8a8_rows<2, Min>(X, M, xs, KB, w, bs, ws, ss, SX, XC, KB, out, ys, mn);
      else w8a8_rows<1, Min>(X, M, xs, KB, w, bs, ws, ss, SX, XC, KB, out, ys, mn);
    }
  });
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// x (M, K) float/bf16; packed = pack_int8(q) of (N, K) int8 weights; scales = pack_blocks of their (N, K/32)
// float block scales, with Min followed by their mins per 16 inputs (pack_blocks of (N, K/32 + K/16)
// values: w = s q + mn) -> (M, N) in x's dtype
template <bool Min>
Tensor w8a8_forward(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t N) {
  const char* name = Min ? "linear_w8a8_min" : "linear_w8a8";
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, name, ": (M, K) CPU rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name, ": float or bf16 rows");
  check_input(packed, "linear_w8a8: packed", at::kByte, 4);
  check_input(scales, "linear_w8a8: scales", at::kFloat, 3);
  TORCH_CHECK(packed.size(2) == kBlock && packed.size(3) == 4, name, ": not a pack_int8 layout");
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), Kp = packed.size(1) * 4, KB = Kp / kQBlock;
  TORCH_CHECK(Kp % kQBlock == 0 && (K + kQBlock - 1) / kQBlock == KB && N >= 0 && N <= NBk * kBlock,
              name, ": x does not match the weight");
  TORCH_CHECK(scales.size(0) == NBk && scales.size(1) == (Min ? 3 : 1) * KB && scales.size(2) == kBlock, name,
              ": scales", Min ? " and mins" : "");
  const QuantizedRows& q = quantized_rows(x, Kp, KB);
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  const float* WS = scales.data_ptr<float>();
  if (x.scalar_type() == at::kFloat)
    w8a8_run<Min>(q.xq.data(), M, Kp, KB, W, WS, q.sx.data(), q.xc.data(), q.xh.data(), y.data_ptr<float>(), NBk);
  else
    w8a8_run<Min>(q.xq.data(), M, Kp, KB, W, WS, q.sx.data(), q.xc.data(), q.xh.data(), y.data_ptr<at::BFloat16>(), NBk);
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}

Tensor linear_w8a8(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t N) {
  return w8a8_forward<false>(x, packed, scales, N);
}
Tensor linear_w8a8_min(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t N) {
  return w8a8_forward<true>(x, packed, scales, N);
}
#endif

}  // namespace
