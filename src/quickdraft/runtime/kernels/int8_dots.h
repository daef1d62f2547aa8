// The int8 tiles' shared ground (w8a8.h, w4a8.h, w6a8.h, q4k.h): the block of 32 inputs, each level's
// stores of 16 outputs, the tiles' row-count dispatch, and each level's integer dot products: AVX2's
// stand-ins for VNNI's vpdpbusd (AVX-VNNI's where the level has it) and Arm's sdot and smmla. Self-contained
// (it includes what it uses); compiled in fused.cpp's one translation unit.
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

#if defined(__AVX512VNNI__)
// quad j's 6-bit codes of Q6_K (pack_q6's layout): the nibbles' low 4 bits (junk above them from a 16-bit shift is dropped) and the
// high-bit vector's bits 2j, 2j+1 moved to bits 4, 5 (what a 16-bit shift carries across a byte lands
// outside 0x30); (A & C) | B over A = nibbles, B = high bits, C = 0x0F is ternary logic 0xEC
template <int J>
inline __m512i q6_codes(__m512i nibbles, __m512i high, __m512i low4, __m512i bits45) {
  if constexpr (J < 2) high = _mm512_slli_epi16(high, 4 - 2 * J);
  if constexpr (J == 3) high = _mm512_srli_epi16(high, 2);
  return _mm512_ternarylogic_epi32(nibbles, _mm512_and_si512(high, bits45), low4, 0xEC);
}
#endif

#if defined(__AVX2__) && !defined(__AVX512VNNI__)
// quad j's 6-bit codes of Q6_K (pack_q6's layout), as q6_codes on 256 bits
inline __m256i q6_codes_avx2(__m256i nibbles, __m256i high, int j, __m256i low4, __m256i bits45) {
  const __m256i top = j < 2 ? _mm256_slli_epi16(high, 4 - 2 * j) : j == 3 ? _mm256_srli_epi16(high, 2) : high;
  return _mm256_or_si256(_mm256_and_si256(nibbles, low4), _mm256_and_si256(top, bits45));
}
#endif

#if defined(__ARM_FEATURE_DOTPROD)
// Q6_K's 6-bit codes of one block at wb (pack_q6's layout) as dot16x16's signed bytes: for quad j, the
// nibble and bits 2j, 2j+1 of the high-bit bytes moved to bits 4, 5; lo: inputs 0-15, hi: inputs 16-31
inline void q6_codes_neon(const uint8_t* wb, int8x16_t lo[4][4], int8x16_t hi[4][4]) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F), two = vdupq_n_u8(3);
  for (int v = 0; v < 4; ++v) {
    const uint8x16_t h_lo = vld1q_u8(wb + 256 + 16 * v), h_hi = vld1q_u8(wb + 320 + 16 * v);
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t raw = vld1q_u8(wb + 64 * j + 16 * v);
      const int8x16_t down = vdupq_n_s8(static_cast<int8_t>(-2 * j));  // a right shift by 2j
      lo[j][v] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(raw, low4), vshlq_n_u8(vandq_u8(vshlq_u8(h_lo, down), two), 4)));
      hi[j][v] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(raw, 4), vshlq_n_u8(vandq_u8(vshlq_u8(h_hi, down), two), 4)));
    }
  }
}
#endif

}  // namespace
