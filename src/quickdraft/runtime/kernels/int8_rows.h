// The int8-activation linears' rows (w8a8.h, w4a8.h, w6a8.h, q4k.h): their quantization per block of 32
// (llama.cpp's Q8_0 activations) at each level, into a thread's buffers; the tiles' shared ground is
// int8_dots.h. Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "int8_dots.h"

namespace {


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
