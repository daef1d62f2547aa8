// The int8-activation linears' shared parts (w8a8.h, w4a8.h, w6a8.h, q4k.h): the
// rows' quantization per block of 32 (llama.cpp's Q8_0 activations), the tiles' row-count dispatch and
// their stores, and AVX2's stand-ins for VNNI's vpdpbusd. Self-contained (it includes what it uses);
// compiled in fused.cpp's one translation unit.
#pragma once

#include "common.h"
#include "linear.h"

namespace {

constexpr int kQBlock = 32;  // inputs per scale block (the activations' and every int8 linear's)

// 16 outputs of one row from float32 accumulators, in the output's dtype (bf16: round to nearest even):
// every int8-activation tile's last step
template <typename out_t>
inline void store16(const float* v, out_t* y) {
  for (int i = 0; i < kBlock; ++i) {
    if constexpr (std::is_same_v<out_t, float>) {
      y[i] = v[i];
    } else {
      *reinterpret_cast<uint16_t*>(y + i) = float_to_bf16(v[i]);
    }
  }
}
// f(std::integral_constant<int, r>{}) for a tile of r rows, 1 <= r <= Max (r beyond: Max): a tile's
// rows are a template argument, so each count is its own instantiation
template <int Max, typename F>
inline void with_rows(int64_t r, F&& f) {
  if constexpr (Max > 1) {
    if (r >= Max) return f(std::integral_constant<int, Max>{});
    return with_rows<Max - 1>(r, f);
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

#if defined(__AVX512F__)
template <typename out_t>
inline void store16(__m512 v, out_t* y) {
  if constexpr (std::is_same_v<out_t, float>) {
    _mm512_storeu_ps(y, v);
  } else {
#if defined(__AVX512BF16__)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(v));
#else
    alignas(64) float tmp[kBlock];
    _mm512_store_ps(tmp, v);
    store16(tmp, y);
#endif
  }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512VNNI__)
// AVX2 without AVX-512's VNNI (levels avx2, avx_vnni and avx512): 16 outputs as two 8-output halves of 256
// bits, and vpdpbusd's products from AVX-VNNI's 256-bit form where the level has it, else from two instructions: vpmaddubsw multiplies unsigned bytes by signed ones and adds
// pairs into int16, vpmaddwd adds pairs of those into int32. The int16 pairs are exact while a code is
// below 129 (2 x 128 x 127 < 2^15): 4- and 6-bit codes as they are, int8 weights after their sign has
// moved onto the activations. The integer sums are the VNNI path's, and the float steps its, in its order.
inline __m256i pairs_u8s8(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }  // int16 pair sums
inline __m256i quads_i16(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }  // to int32
// acc + the int32 sums of u's unsigned byte quads times s's signed ones: AVX-VNNI's 256-bit vpdpbusd (level
// avx_vnni: one instruction) or the two above and an add; the same integers either way (no pair saturates)
inline __m256i dot_quads(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, quads_i16(pairs_u8s8(u, s)));
#endif
}
// two products of quads into acc: without VNNI their int16 pair sums are added before one widening
// (callers keep 2 x 2 x 63 x 127 < 2^15)
inline __m256i dot_quads2(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, u0, s0), u1, s1);
#else
  return _mm256_add_epi32(acc, quads_i16(_mm256_add_epi16(pairs_u8s8(u0, s0), pairs_u8s8(u1, s1))));
#endif
}
inline __m256i bcast4(const int8_t* x) {  // a quad of activations in every 32-bit lane
  int32_t quad;
  std::memcpy(&quad, x, sizeof quad);
  return _mm256_set1_epi32(quad);
}
template <typename out_t>
inline void store16(__m256 lo, __m256 hi, out_t* y) {
  if constexpr (std::is_same_v<out_t, float>) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
  } else {
    alignas(32) float tmp[kBlock];
    _mm256_store_ps(tmp, lo);
    _mm256_store_ps(tmp + 8, hi);
    store16(tmp, y);
  }
}
inline __m256 half8(const uint8_t* p) {  // 8 fp16 -> float
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

#if defined(__ARM_FEATURE_DOTPROD)
// Arm (levels dotprod and i8mm): 16 outputs as four 4-output vectors, and vpdpbusd's products from `sdot`
// (signed x signed bytes, four lanes of four products) or, for two rows at once, `smmla` (a 2 x 8 by
// 8 x 2 integer matrix product). Every int8 tile decodes its weights into signed codes of 16 inputs x 16
// outputs, laid out as the x86 tiles read them: q[j][v] holds quad j (inputs 4j..4j+3) of outputs
// 4v..4v+3, four bytes an output, and adds their products with MB rows' 16 activations (x + m xs) into
// acc[m][v]. Integer sums are exact in any order: the float steps after them are each tile's scalar ones.
template <int MB>
inline void dot16x16(const int8x16_t q[4][4], const int8_t* x, int64_t xs, int32x4_t acc[][4]) {
#if defined(__ARM_FEATURE_MATMUL_INT8)
  if constexpr (MB == 2) {  // smmla: rows 0-1 x outputs (2i, 2i+1) over 8 inputs; zips make the pairs
    int32x4_t p[8];
    for (int i = 0; i < 8; ++i) p[i] = vdupq_n_s32(0);
    for (int j = 0; j < 4; j += 2) {
      const int8x16_t a = vcombine_s8(vld1_s8(x + 4 * j), vld1_s8(x + xs + 4 * j));  // 2 rows x 8 inputs
      for (int v = 0; v < 4; ++v) {
        const int32x4_t q0 = vreinterpretq_s32_s8(q[j][v]), q1 = vreinterpretq_s32_s8(q[j + 1][v]);
        p[2 * v] = vmmlaq_s32(p[2 * v], a, vreinterpretq_s8_s32(vzip1q_s32(q0, q1)));  // outputs 4v, 4v+1
        p[2 * v + 1] = vmmlaq_s32(p[2 * v + 1], a, vreinterpretq_s8_s32(vzip2q_s32(q0, q1)));  // 4v+2, 4v+3
      }
    }
    for (int v = 0; v < 4; ++v) {  // (r0 o0, r0 o1, r1 o0, r1 o1) pairs -> each row's four outputs
      const int64x2_t a = vreinterpretq_s64_s32(p[2 * v]), b = vreinterpretq_s64_s32(p[2 * v + 1]);
      acc[0][v] = vaddq_s32(acc[0][v], vreinterpretq_s32_s64(vzip1q_s64(a, b)));
      acc[1][v] = vaddq_s32(acc[1][v], vreinterpretq_s32_s64(vzip2q_s64(a, b)));
    }
    return;
  }
#endif
  for (int m = 0; m < MB; ++m) {
    const int8x16_t xv = vld1q_s8(x + m * xs);
    for (int v = 0; v < 4; ++v) {  // the lane is an immediate: the four quads written out
      int32x4_t a = vdotq_laneq_s32(acc[m][v], q[0][v], xv, 0);
      a = vdotq_laneq_s32(a, q[1][v], xv, 1);
      a = vdotq_laneq_s32(a, q[2][v], xv, 2);
      acc[m][v] = vdotq_laneq_s32(a, q[3][v], xv, 3);
    }
  }
}
inline float32x4_t half4(const uint8_t* p) {  // 4 fp16 -> float (exact)
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}
inline float32x4_t bytes4_u8(const uint8_t* p) {  // 4 unsigned bytes -> float
  uint8x8_t b = vdup_n_u8(0);
  b = vreinterpret_u8_u32(vld1_lane_u32(reinterpret_cast<const uint32_t*>(p), vreinterpret_u32_u8(b), 0));
  return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))));
}
inline float32x4_t bytes4_s8(const uint8_t* p) {  // 4 signed bytes -> float
  uint8x8_t b = vdup_n_u8(0);
  b = vreinterpret_u8_u32(vld1_lane_u32(reinterpret_cast<const uint32_t*>(p), vreinterpret_u32_u8(b), 0));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b)))));
}
template <typename out_t>
inline void store16(const float32x4_t v[4], out_t* y) {
  alignas(16) float tmp[kBlock];
  for (int i = 0; i < 4; ++i) vst1q_f32(tmp + 4 * i, v[i]);
  store16(tmp, y);
}
#endif

// One whole block of 32 inputs quantized with vector instructions, the same values as the scalar loop in
// `quantize_rows`: the absolute maximum is exact in any order (NaNs ignored, as std::max ignores them), the
// scale 127 / amax is the scalar one, each code is one float product rounded by the current rounding mode (to
// nearest even, as lrint), and the half-block sums are integer sums. Returns false where no vector path is
// built (the scalar loop runs). Profiled before it (the 1.5B's prefill of 709 tokens, AVX-512 EPYC, 2
// threads): the scalar loop took 12% of the prefill.
#if defined(__AVX512F__)
template <typename in_t>
inline __m512 load16_float(const in_t* p) {
  if constexpr (std::is_same_v<in_t, float>) {
    return _mm512_loadu_ps(p);
  } else {  // bf16: its 16 bits are a float's upper half
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
}
template <typename in_t>
inline bool quantize_block32(const in_t* x, int8_t* q, float* scale, int32_t half[2]) {
  const __m512 a = load16_float(x), b = load16_float(x + 16), zero = _mm512_setzero_ps();
  // max(|v|, 0) turns a NaN into 0 (the second operand is returned when either is NaN)
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(a), zero),
                                                        _mm512_max_ps(_mm512_abs_ps(b), zero)));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  *scale = amax / 127.f;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vinv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vinv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  half[0] = _mm512_reduce_add_epi32(qa);
  half[1] = _mm512_reduce_add_epi32(qb);
  return true;
}
#elif defined(__AVX2__)
template <typename in_t>
inline __m256 load8_float(const in_t* p) {
  if constexpr (std::is_same_v<in_t, float>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
}
inline int32_t sum8_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
template <typename in_t>
inline bool quantize_block32(const in_t* x, int8_t* q, float* scale, int32_t half[2]) {
  __m256 v[4];
  const __m256 zero = _mm256_setzero_ps(), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = zero;
  for (int i = 0; i < 4; ++i) {
    v[i] = load8_float(x + 8 * i);
    mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[i], abs_mask), zero), mx);  // NaN -> 0, as above
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  *scale = amax / 127.f;
  const __m256 vinv = _mm256_set1_ps(inv);
  alignas(32) int32_t codes[kQBlock];
  __m256i c[4];
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vinv));
    _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * i), c[i]);
  }
  for (int i = 0; i < kQBlock; ++i) q[i] = static_cast<int8_t>(codes[i]);  // truncation, as the scalar cast
  half[0] = sum8_i32(_mm256_add_epi32(c[0], c[1]));
  half[1] = sum8_i32(_mm256_add_epi32(c[2], c[3]));
  return true;
}
#elif defined(__ARM_NEON)
template <typename in_t>
inline float32x4_t load4_float(const in_t* p) {
  if constexpr (std::is_same_v<in_t, float>) {
    return vld1q_f32(p);
  } else {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
  }
}
template <typename in_t>
inline bool quantize_block32(const in_t* x, int8_t* q, float* scale, int32_t half[2]) {
  float32x4_t v[8];
  const float32x4_t zero = vdupq_n_f32(0.f);
  float32x4_t mx = zero;
  for (int i = 0; i < 8; ++i) {
    v[i] = load4_float(x + 4 * i);
    mx = vmaxnmq_f32(mx, vmaxnmq_f32(vabsq_f32(v[i]), zero));  // maxnm: a NaN gives way to the number, as above
  }
  const float amax = vmaxnmvq_f32(mx);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  *scale = amax / 127.f;
  const float32x4_t vinv = vdupq_n_f32(inv);
  int32x4_t c[8];
  for (int i = 0; i < 8; ++i) c[i] = vcvtnq_s32_f32(vmulq_f32(v[i], vinv));  // to nearest even, as lrint
  for (int i = 0; i < 8; i += 2)  // truncating narrows, as the scalar cast
    vst1_s8(q + 4 * i, vmovn_s16(vcombine_s16(vmovn_s32(c[i]), vmovn_s32(c[i + 1]))));
  half[0] = vaddvq_s32(vaddq_s32(vaddq_s32(c[0], c[1]), vaddq_s32(c[2], c[3])));
  half[1] = vaddvq_s32(vaddq_s32(vaddq_s32(c[4], c[5]), vaddq_s32(c[6], c[7])));
  return true;
}
#else
template <typename in_t>
inline bool quantize_block32(const in_t*, int8_t*, float*, int32_t*) {
  return false;
}
#endif

// rows (M, K) -> per row and block of 32: symmetric int8 codes (row stride Kp), their scales, 128 x their sums
// and the sums of each half-block of 16 (xh, (M, 2 KB): the min terms of weights with a min per 16 or 32)
template <typename in_t>
void quantize_rows(const in_t* X, int64_t M, int64_t K, int64_t Kp, int64_t KB, int8_t* xq, float* sx, int32_t* xc,
                   int32_t* xh) {
  const auto one = [&](int64_t m, int64_t b) {  // one row's block: independent of every other
    float buf[kQBlock];
    const int64_t k0 = b * kQBlock, n = std::min<int64_t>(K, k0 + kQBlock) - k0;
    int32_t whole[2];
    if (n == kQBlock && quantize_block32(X + m * K + k0, xq + m * Kp + k0, sx + m * KB + b, whole)) {
      xc[m * KB + b] = 128 * (whole[0] + whole[1]);
      xh[m * 2 * KB + 2 * b] = whole[0];
      xh[m * 2 * KB + 2 * b + 1] = whole[1];
      return;
    }
    float amax = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      buf[i] = static_cast<float>(X[m * K + k0 + i]);
      amax = std::max(amax, std::fabs(buf[i]));
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    sx[m * KB + b] = amax / 127.f;
    int32_t half[2] = {0, 0};
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = static_cast<int32_t>(std::lrint(buf[i] * inv));  // inlined: no errno
      xq[m * Kp + k0 + i] = static_cast<int8_t>(v);
      half[i >= kQBlock / 2] += v;
    }
    xc[m * KB + b] = 128 * (half[0] + half[1]);
    xh[m * 2 * KB + 2 * b] = half[0];
    xh[m * 2 * KB + 2 * b + 1] = half[1];
  };
  if (M == 1) {  // a one-row step: too little work to share
    for (int64_t b = 0; b < KB; ++b) one(0, b);
    return;
  }
  at::parallel_for(0, M * KB, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) one(i / KB, i % KB);
  });
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// A call's rows quantized as `quantize_rows` does, into this thread's buffers (reused call after call):
// codes with row stride Kp (zero-padded), scales and 128 x block sums, (M, KB) each, half-block sums (M, 2 KB).
struct QuantizedRows {
  std::vector<int8_t> xq;
  std::vector<float> sx;
  std::vector<int32_t> xc;  // 128 x each block's sum of codes (w8a8: the weights' shift, taken back)
  std::vector<int32_t> xh;  // each half-block's sum of codes (the mins of linear_w8a8_min)
};

const QuantizedRows& quantized_rows(const Tensor& x, int64_t Kp, int64_t KB) {
  thread_local QuantizedRows q;
  const int64_t M = x.size(0), K = x.size(1);
  const Tensor xc = x.contiguous();
  q.xq.assign(M * Kp, 0);
  q.sx.resize(M * KB);
  q.xc.resize(M * KB);
  q.xh.resize(2 * M * KB);
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantized_rows",
    AT_DISPATCH_CASE(at::kFloat, [&] { quantize_rows(xc.data_ptr<float>(), M, K, Kp, KB, q.xq.data(), q.sx.data(), q.xc.data(), q.xh.data()); })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      quantize_rows(xc.data_ptr<at::BFloat16>(), M, K, Kp, KB, q.xq.data(), q.sx.data(), q.xc.data(), q.xh.data());
    }));
  return q;
}
#endif

}  // namespace
