// pack_q4k / linear_q4k: a GGUF's Q4_K weights as stored (4-bit codes, 6-bit scales and mins per 32
// inputs, fp16 d and dmin per 256) x int8 activations (VNNI where present). Python: runtime/quant/q4k.py.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "w4a8.h"

namespace {

// ---- Q4_K weights x int8 activations in blocks of 32 on VNNI -----------------------------------------------
// Weights: w = d sc_b q - dmin mn_b, q a code 0..15, sc_b and mn_b 6-bit integers per output and block
// of 32 inputs, d and dmin fp16 per output and super-block of 256. pack_q4k lays them out per 16
// outputs as K/256 super-blocks of 2,368 bytes: the 16 outputs' d, then their dmin (fp16), the eight
// blocks' sc, then their mn (a byte an output), then the blocks' codes as pack_q4's four 64-byte quads
// (each block's on a 64-byte boundary): 4.625 bits
// a weight against w4a8's 5, and d sc_b and dmin mn_b exact in float32 (11 x 6 bits), where w4a8 rounds
// each to fp16. Then, as linear_w4a8 in the same float order:
// y[r, n] = sum_b (dot * (d sc_b * s_x[r, b]) - dmin mn_b * s_x[r, b] sum_k x_q).
constexpr int64_t kQ4KSc = 4 * kBlock, kQ4KMn = kQ4KSc + 8 * kBlock, kQ4KCodes = kQ4KMn + 8 * kBlock;  // offsets
constexpr int64_t kQ4KSuper = kQ4KCodes + 8 * 256;  // d, dmin, sc, mn, then eight blocks' codes
constexpr int64_t kQ4KAhead = 2 * kQ4KSuper;         // bytes fetched ahead of the block being multiplied

// one output o's super-block in pack_q4k's layout at sup: its 256 codes 0..15, eight sc and mn 0..63,
// and d and dmin as fp16 bits
inline void put_q4k(uint8_t* sup, int64_t o, const uint8_t* codes, const uint8_t* sc, const uint8_t* mn, uint16_t dh,
                    uint16_t mh) {
  std::memcpy(sup + 2 * o, &dh, 2);
  std::memcpy(sup + 2 * kBlock + 2 * o, &mh, 2);
  for (int c = 0; c < 8; ++c) {
    uint8_t* blk = sup + kQ4KCodes + 256 * c;
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 4; ++i)
        blk[64 * j + 4 * o + i] =
            static_cast<uint8_t>((codes[32 * c + 4 * j + i] & 0x0F) | ((codes[32 * c + 16 + 4 * j + i] & 0x0F) << 4));
    sup[kQ4KSc + kBlock * c + o] = sc[c] & 0x3F;
    sup[kQ4KMn + kBlock * c + o] = mn[c] & 0x3F;
  }
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// codes (N, K) uint8 0..15, sc and mn (N, K/32) uint8 0..63, d and dmin (N, K/256) float, K a multiple of 256
// -> (ceil(N/16), K/256, 2368) uint8 (zero-padded outputs)
Tensor pack_q4k(const Tensor& codes, const Tensor& sc, const Tensor& mn, const Tensor& d, const Tensor& dmin) {
  check_input(codes, "pack_q4k: codes", at::kByte, 2);
  check_input(sc, "pack_q4k: sc", at::kByte, 2);
  check_input(mn, "pack_q4k: mn", at::kByte, 2);
  check_input(d, "pack_q4k: d", at::kFloat, 2);
  check_input(dmin, "pack_q4k: dmin", at::kFloat, 2);
  const int64_t N = codes.size(0), K = codes.size(1), KS = K / 256, NBk = (N + kBlock - 1) / kBlock;
  TORCH_CHECK(K % 256 == 0 && sc.sizes() == mn.sizes() && sc.size(0) == N && sc.size(1) == K / kQBlock &&
                  d.sizes() == dmin.sizes() && d.size(0) == N && d.size(1) == KS,
              "pack_q4k: (N, K) codes with K a multiple of 256, (N, K/32) sc and mn, (N, K/256) d and dmin");
  Tensor out = at::zeros({NBk, KS, kQ4KSuper}, codes.options());
  const uint8_t *C = codes.data_ptr<uint8_t>(), *S = sc.data_ptr<uint8_t>(), *Mn = mn.data_ptr<uint8_t>();
  const float *D = d.data_ptr<float>(), *Dm = dmin.data_ptr<float>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {  // each 16 outputs' bytes are their own
    for (int64_t n = begin * kBlock; n < std::min(N, end * kBlock); ++n)
      for (int64_t s = 0; s < KS; ++s)
        put_q4k(O + ((n / kBlock) * KS + s) * kQ4KSuper, n % kBlock, C + n * K + 256 * s, S + n * (K / kQBlock) + 8 * s,
                Mn + n * (K / kQBlock) + 8 * s, half_bits(D[n * KS + s]), half_bits(Dm[n * KS + s]));
  });
  return out;
}

// a GGUF Q4_K tensor's rows as stored, (N, K/256 x 144) uint8 (per 256 weights: d and dmin in fp16, 12
// bytes of eight 6-bit sc and mn, 128 of codes, each 64 weights as 32 low nibbles then 32 high ones)
// -> pack_q4k's layout, in one pass (the same bytes as pack_q4k of the decoded parts)
Tensor pack_q4k_gguf(const Tensor& raw) {
  check_input(raw, "pack_q4k_gguf: raw", at::kByte, 2);
  TORCH_CHECK(raw.size(1) % 144 == 0, "pack_q4k_gguf: (N, K/256 x 144) Q4_K rows");
  const int64_t N = raw.size(0), KS = raw.size(1) / 144, NBk = (N + kBlock - 1) / kBlock;
  Tensor out = at::zeros({NBk, KS, kQ4KSuper}, raw.options());
  const uint8_t* R = raw.data_ptr<uint8_t>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {
    uint8_t codes[256], sc[8], mn[8];
    for (int64_t n = begin * kBlock; n < std::min(N, end * kBlock); ++n)
      for (int64_t s = 0; s < KS; ++s) {
        const uint8_t* p = R + (n * KS + s) * 144;
        const uint8_t *q = p + 4, *qs = p + 16;
        for (int j = 0; j < 8; ++j) {  // llama.cpp's get_scale_min_k4
          sc[j] = j < 4 ? q[j] & 63 : static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
          mn[j] = j < 4 ? q[j + 4] & 63 : static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
        for (int c = 0; c < 8; ++c)
          for (int t = 0; t < 32; ++t) codes[32 * c + t] = (qs[32 * (c / 2) + t] >> (4 * (c % 2))) & 0x0F;
        uint16_t dh, mh;
        std::memcpy(&dh, p, 2);
        std::memcpy(&mh, p + 2, 2);
        put_q4k(O + ((n / kBlock) * KS + s) * kQ4KSuper, n % kBlock, codes, sc, mn, dh, mh);
      }
  });
  return out;
}
#endif

template <int MB, typename out_t>
inline void q4k_tile(const int8_t* x, int64_t xs, int64_t KS, const uint8_t* w, const float* sx, const float* sxq,
                     int64_t sxs, out_t* y, int64_t ys) {
#if defined(__AVX512VNNI__)
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 facc[MB];
  for (int m = 0; m < MB; ++m) facc[m] = _mm512_setzero_ps();
  for (int64_t s = 0; s < KS; ++s) {
    const uint8_t* sup = w + s * kQ4KSuper;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 2 * kBlock)));
    for (int64_t c = 0; c < 8; ++c) {
      const int64_t b = 8 * s + c;
      const uint8_t* wb = sup + kQ4KCodes + 256 * c;
      if constexpr (MB > 1)  // this block's share of the super-block two ahead (its header with block 0)
        for (int l = 0; l < (c ? 256 : 256 + kQ4KCodes); l += 64)
          _mm_prefetch(reinterpret_cast<const char*>((c ? wb : sup) + kQ4KAhead + l), _MM_HINT_T0);
      __m512i lo_acc[MB], hi_acc[MB];
      for (int m = 0; m < MB; ++m) lo_acc[m] = hi_acc[m] = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(wb + 64 * j);
        const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        for (int m = 0; m < MB; ++m) {
          int32_t q0, q1;
          std::memcpy(&q0, x + m * xs + 32 * b + 4 * j, 4);
          std::memcpy(&q1, x + m * xs + 32 * b + 16 + 4 * j, 4);
          lo_acc[m] = _mm512_dpbusd_epi32(lo_acc[m], lo, _mm512_set1_epi32(q0));
          if constexpr (MB == 1) {  // one row: two chains hide vpdpbusd's latency
            hi_acc[m] = _mm512_dpbusd_epi32(hi_acc[m], hi, _mm512_set1_epi32(q1));
          } else {
            lo_acc[m] = _mm512_dpbusd_epi32(lo_acc[m], hi, _mm512_set1_epi32(q1));
          }
        }
      }
      const __m512 dv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + kQ4KSc + kBlock * c)))));
      const __m512 mv = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + kQ4KMn + kBlock * c)))));
      for (int m = 0; m < MB; ++m) {
        const __m512 dot = _mm512_cvtepi32_ps(MB == 1 ? _mm512_add_epi32(lo_acc[m], hi_acc[m]) : lo_acc[m]);
        facc[m] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dv, _mm512_set1_ps(sx[m * sxs + b])), facc[m]);
        facc[m] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(sxq[m * sxs + b]), facc[m]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#elif defined(__AVX2__)
  __m256 facc[MB][2];
  for (int m = 0; m < MB; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
  for (int64_t s = 0; s < KS; ++s) {
    const uint8_t* sup = w + s * kQ4KSuper;
    const __m256 d[2] = {half8(sup), half8(sup + 16)}, dmin[2] = {half8(sup + 2 * kBlock), half8(sup + 2 * kBlock + 16)};
    for (int64_t c = 0; c < 8; ++c) {
      const int64_t b = 8 * s + c;
      const uint8_t* wb = sup + kQ4KCodes + 256 * c;
      if constexpr (MB > 1)
        for (int l = 0; l < (c ? 256 : 256 + kQ4KCodes); l += 64)
          _mm_prefetch(reinterpret_cast<const char*>((c ? wb : sup) + kQ4KAhead + l), _MM_HINT_T0);
      __m256i acc[MB][2];  // the block's int32 sums, as linear_w4a8's AVX2 path
      q4_dots_avx2<MB>(wb, x + 32 * b, xs, acc);
      for (int h = 0; h < 2; ++h) {
        const auto bytes8 = [&](int64_t off) {  // 8 unsigned bytes -> float
          return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sup + off))));
        };
        const __m256 dv = _mm256_mul_ps(d[h], bytes8(kQ4KSc + kBlock * c + 8 * h));
        const __m256 mv = _mm256_mul_ps(dmin[h], bytes8(kQ4KMn + kBlock * c + 8 * h));
        for (int m = 0; m < MB; ++m) {
          const __m256 dot = _mm256_cvtepi32_ps(acc[m][h]);
          facc[m][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(sx[m * sxs + b])), facc[m][h]);
          facc[m][h] = _mm256_fnmadd_ps(mv, _mm256_set1_ps(sxq[m * sxs + b]), facc[m][h]);
        }
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m][0], facc[m][1], y + m * ys);
#elif defined(__ARM_FEATURE_DOTPROD)
  float32x4_t facc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < 4; ++v) facc[m][v] = vdupq_n_f32(0.f);
  for (int64_t s = 0; s < KS; ++s) {
    const uint8_t* sup = w + s * kQ4KSuper;
    float32x4_t d[4], dmin[4];
    for (int v = 0; v < 4; ++v) d[v] = half4(sup + 8 * v), dmin[v] = half4(sup + 2 * kBlock + 8 * v);
    for (int64_t c = 0; c < 8; ++c) {
      const int64_t b = 8 * s + c;
      int32x4_t acc[MB][4];
      q4_dots_neon<MB>(sup + kQ4KCodes + 256 * c, x + 32 * b, xs, acc);
      for (int v = 0; v < 4; ++v) {
        float32x4_t dv = vmulq_f32(d[v], bytes4_u8(sup + kQ4KSc + kBlock * c + 4 * v));
        const float32x4_t mv = vmulq_f32(dmin[v], bytes4_u8(sup + kQ4KMn + kBlock * c + 4 * v));
        asm volatile("" : "+w"(dv));  // d sc stays a product before s_x multiplies it (as the scalar path)
        for (int m = 0; m < MB; ++m) {
          facc[m][v] = vfmaq_f32(facc[m][v], vcvtq_f32_s32(acc[m][v]), vmulq_n_f32(dv, sx[m * sxs + b]));
          facc[m][v] = vfmsq_f32(facc[m][v], mv, vdupq_n_f32(sxq[m * sxs + b]));
        }
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#else
  float facc[MB][kBlock] = {};
  for (int64_t s = 0; s < KS; ++s) {
    const uint8_t* sup = w + s * kQ4KSuper;
    float d[kBlock], dmin[kBlock];
    for (int o = 0; o < kBlock; ++o) {
      uint16_t dh, mh;
      std::memcpy(&dh, sup + 2 * o, 2);
      std::memcpy(&mh, sup + 2 * kBlock + 2 * o, 2);
      d[o] = static_cast<float>(c10::Half(dh, c10::Half::from_bits()));
      dmin[o] = static_cast<float>(c10::Half(mh, c10::Half::from_bits()));
    }
    for (int64_t c = 0; c < 8; ++c) {
      const int64_t b = 8 * s + c;
      const uint8_t* wb = sup + kQ4KCodes + 256 * c;
      float dv[kBlock], mv[kBlock];
      for (int o = 0; o < kBlock; ++o) {
        dv[o] = d[o] * static_cast<float>(sup[kQ4KSc + kBlock * c + o]);
        mv[o] = dmin[o] * static_cast<float>(sup[kQ4KMn + kBlock * c + o]);
      }
      // the products stay products: -fassociative-math must not regroup d (sc s_x) per tile shape
      asm volatile("" : : "r"(dv), "r"(mv) : "memory");
      for (int m = 0; m < MB; ++m) {
        int32_t acc[kBlock] = {};
        for (int j = 0; j < 4; ++j)
          for (int o = 0; o < kBlock; ++o)
            for (int i = 0; i < 4; ++i) {
              const uint8_t v = wb[64 * j + 4 * o + i];
              acc[o] += static_cast<int32_t>(v & 0x0F) * x[m * xs + 32 * b + 4 * j + i] +
                        static_cast<int32_t>(v >> 4) * x[m * xs + 32 * b + 16 + 4 * j + i];
            }
        for (int o = 0; o < kBlock; ++o) {  // the vector path's order: the same bits whatever the tile's rows
          facc[m][o] = std::fma(static_cast<float>(acc[o]), dv[o] * sx[m * sxs + b], facc[m][o]);
          facc[m][o] = std::fma(-mv[o], sxq[m * sxs + b], facc[m][o]);
        }
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#endif
}

template <typename out_t>
void q4k_run(const int8_t* X, int64_t M, int64_t xs, int64_t KS, const uint8_t* W, const float* SX,
             const float* SXQ, out_t* Y, int64_t NBk) {
  const int64_t ys = NBk * kBlock, KB = 8 * KS;
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nb = begin; nb < end; ++nb) {
      const uint8_t* w = W + nb * KS * kQ4KSuper;
      for (int64_t m = 0; m < M; m += kQ4Rows) {
        const int64_t r = std::min<int64_t>(kQ4Rows, M - m);
        const int8_t* xr = X + m * xs;
        const float *s = SX + m * KB, *sq = SXQ + m * KB;
        out_t* yr = Y + nb * kBlock + m * ys;
        with_rows<kQ4Rows>(r, [&](auto mb) { q4k_tile<decltype(mb)::value>(xr, xs, KS, w, s, sq, KB, yr, ys); });
      }
    }
  });
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// x (M, K) float/bf16; packed = pack_q4k of (N, K) codes -> (M, N) in x's dtype
Tensor linear_q4k(const Tensor& x, const Tensor& packed, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "linear_q4k: (M, K) CPU rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_q4k: float or bf16 rows");
  check_input(packed, "linear_q4k: packed", at::kByte, 3);
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), KS = packed.size(1), KB = 8 * KS, Kp = 256 * KS;
  TORCH_CHECK(K == Kp && packed.size(2) == kQ4KSuper && N >= 0 && N <= NBk * kBlock,
              "linear_q4k: x does not match the packed weight");
  const QuantizedRows& q = quantized_rows(x, Kp, KB);
  thread_local std::vector<float> sxq;
  sxq.resize(M * KB);
  for (int64_t i = 0; i < M * KB; ++i) sxq[i] = q.sx[i] * static_cast<float>(q.xc[i] / 128);  // scale x block sum
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  if (x.scalar_type() == at::kFloat)
    q4k_run<float>(q.xq.data(), M, Kp, KS, W, q.sx.data(), sxq.data(), y.data_ptr<float>(), NBk);
  else
    q4k_run<at::BFloat16>(q.xq.data(), M, Kp, KS, W, q.sx.data(), sxq.data(), y.data_ptr<at::BFloat16>(), NBk);
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}
#endif

}  // namespace
