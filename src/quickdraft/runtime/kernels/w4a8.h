// pack_q4 / linear_w4a8: 4-bit weights (a GGUF's Q4_0/Q4_1 blocks) x int8 activations (VNNI where
// present). Python: runtime/quant/w4a8.py.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "int8_rows.h"

namespace {


// ---- 4-bit weights x int8 activations in blocks of 32 (W4A8, as llama.cpp's Q4_1 x Q8_1) on VNNI ---------
// Weights: codes q in 0..15 with one fp16 scale d and min m per output and block of 32 inputs, w = q d + m
// (a GGUF's Q4_1 blocks as they are; Q4_0's have m = -8 d). pack_q4 lays them out as (N/16, K/32, 320)
// bytes: for each 16 outputs and block, four 64-byte code quads (byte i of output o in quad j holds
// q[o, 32b + 4j + i] in its low nibble and q[o, 32b + 16 + 4j + i] in its high one), then the 16 outputs'
// d and their m in fp16: one sequential stream of 5 bits a weight. The codes are unsigned, so one vpdpbusd
// multiplies 16 outputs' code quads by a broadcast quad of signed int8 activations, and the min comes
// back through the activations' block sum: y[r, n] = sum_b s_x[r, b] (d[n, b] sum_k q x_q + m[n, b] sum_k x_q).
// A row's arithmetic does not depend on the rows beside it (integer sums, then one float order): batch-invariant.
constexpr int64_t kQ4Bytes = 4 * 64 + 2 * 2 * kBlock;
constexpr int64_t kQ4Ahead = 24 * kQ4Bytes;  // bytes fetched ahead of the block being multiplied (7.5 KB: 16-32 blocks measured alike)

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
inline uint16_t half_bits(float f) { return c10::Half(f).x; }

// codes (N, K) uint8 0..15, d and m (N, ceil(K/32)) float -> (ceil(N/16), ceil(K/32), 320) uint8 (zero-padded)
Tensor pack_q4(const Tensor& codes, const Tensor& d, const Tensor& mins) {
  TORCH_CHECK(codes.device().is_cpu() && codes.dim() == 2 && codes.scalar_type() == at::kByte, "pack_q4: (N, K) uint8 codes");
  const int64_t N = codes.size(0), K = codes.size(1), KB = (K + kQBlock - 1) / kQBlock, NBk = (N + kBlock - 1) / kBlock;
  TORCH_CHECK(d.sizes() == mins.sizes() && d.size(0) == N && d.size(1) == KB, "pack_q4: (N, K/32) scales and mins");
  const Tensor c = codes.contiguous(), df = d.to(at::kFloat).contiguous(), mf = mins.to(at::kFloat).contiguous();
  Tensor out = at::zeros({NBk, KB, kQ4Bytes}, codes.options());
  const uint8_t* C = c.data_ptr<uint8_t>();
  const float* D = df.data_ptr<float>();
  const float* Mn = mf.data_ptr<float>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {  // each 16 outputs' bytes are their own
    for (int64_t n = begin * kBlock; n < std::min(N, end * kBlock); ++n) {
      const int64_t nb = n / kBlock, o = n % kBlock;
      for (int64_t b = 0; b < KB; ++b) {
        uint8_t* blk = O + (nb * KB + b) * kQ4Bytes;
        for (int j = 0; j < 4; ++j)
          for (int i = 0; i < 4; ++i) {
            const int64_t k0 = 32 * b + 4 * j + i, k1 = k0 + 16;
            const uint8_t lo = k0 < K ? C[n * K + k0] & 0x0F : 0, hi = k1 < K ? C[n * K + k1] & 0x0F : 0;
            blk[64 * j + 4 * o + i] = static_cast<uint8_t>(lo | (hi << 4));
          }
        const uint16_t dh = half_bits(D[n * KB + b]), mh = half_bits(Mn[n * KB + b]);
        std::memcpy(blk + 256 + 2 * o, &dh, 2);
        std::memcpy(blk + 256 + 2 * kBlock + 2 * o, &mh, 2);
      }
    }
  });
  return out;
}
#endif

#if defined(__AVX2__) && !defined(__AVX512VNNI__)
// one block's four 64-byte code quads at wb (pack_q4's layout, Q4_K's too) times MB rows' 32 activations
// at x (row stride xs): the int32 sums of each 8-output half, acc[m][h]. Without VNNI the int16 pair sums
// of the whole block are added first (8 products of 2 x 15 x 127 stay below 2^15), then widened once.
template <int MB>
inline void q4_dots_avx2(const uint8_t* wb, const int8_t* x, int64_t xs, __m256i acc[][2]) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * j + 32 * h));
      const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      for (int m = 0; m < MB; ++m) {
        const __m256i xl = bcast4(x + m * xs + 4 * j), xh = bcast4(x + m * xs + 16 + 4 * j);
#if defined(__AVXVNNI__)
        acc[m][h] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc[m][h], lo, xl), hi, xh);
#else
        acc[m][h] = _mm256_add_epi16(acc[m][h], _mm256_add_epi16(pairs_u8s8(lo, xl), pairs_u8s8(hi, xh)));
#endif
      }
    }
#if !defined(__AVXVNNI__)
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < 2; ++h) acc[m][h] = quads_i16(acc[m][h]);
#endif
}
#endif

#if defined(__ARM_FEATURE_DOTPROD)
// one block's four 64-byte code quads at wb (pack_q4's layout, Q4_K's too) times MB rows' 32 activations at
// x (row stride xs): the int32 sums of each 4-output vector, acc[m][v] (low nibbles: inputs 0-15, high: 16-31)
template <int MB>
inline void q4_dots_neon(const uint8_t* wb, const int8_t* x, int64_t xs, int32x4_t acc[][4]) {
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < 4; ++v) acc[m][v] = vdupq_n_s32(0);
  int8x16_t lo[4][4], hi[4][4];
  for (int j = 0; j < 4; ++j)
    for (int v = 0; v < 4; ++v) {
      const uint8x16_t raw = vld1q_u8(wb + 64 * j + 16 * v);
      lo[j][v] = vreinterpretq_s8_u8(vandq_u8(raw, nibble));
      hi[j][v] = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
    }
  dot16x16<MB>(lo, x, xs, acc);
  dot16x16<MB>(hi, x + 16, xs, acc);
}
#endif

template <int MB, typename out_t>
inline void w4a8_tile(const int8_t* x, int64_t xs, int64_t KB, const uint8_t* w, const float* sx, const float* sxq,
                      int64_t sxs, out_t* y, int64_t ys) {
#if defined(__AVX512VNNI__)
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 facc[MB];
  for (int m = 0; m < MB; ++m) facc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ4Bytes;
    if constexpr (MB > 1)  // a tile of several rows computes longer than its bytes take to arrive: fetch ahead
      for (int l = 0; l < kQ4Bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + kQ4Ahead + l), _MM_HINT_T0);
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
        } else {  // several rows are independent chains already: one accumulator each
          lo_acc[m] = _mm512_dpbusd_epi32(lo_acc[m], hi, _mm512_set1_epi32(q1));
        }
      }
    }
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256)));
    const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + 2 * kBlock)));
    for (int m = 0; m < MB; ++m) {
      const __m512 dot = _mm512_cvtepi32_ps(MB == 1 ? _mm512_add_epi32(lo_acc[m], hi_acc[m]) : lo_acc[m]);
      facc[m] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dv, _mm512_set1_ps(sx[m * sxs + b])), facc[m]);
      facc[m] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sxq[m * sxs + b]), facc[m]);
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#elif defined(__AVX2__)
  __m256 facc[MB][2];
  for (int m = 0; m < MB; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ4Bytes;
    for (int l = 0; l < kQ4Bytes; l += 64)  // every height here, as w6a8's AVX2 tile
      _mm_prefetch(reinterpret_cast<const char*>(wb + kQ4Ahead + l), _MM_HINT_T0);
    __m256i acc[MB][2];
    q4_dots_avx2<MB>(wb, x + 32 * b, xs, acc);
    for (int h = 0; h < 2; ++h) {
      const __m256 dv = half8(wb + 256 + 16 * h), mv = half8(wb + 256 + 2 * kBlock + 16 * h);
      for (int m = 0; m < MB; ++m) {
        const __m256 dot = _mm256_cvtepi32_ps(acc[m][h]);
        facc[m][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(sx[m * sxs + b])), facc[m][h]);
        facc[m][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(sxq[m * sxs + b]), facc[m][h]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m][0], facc[m][1], y + m * ys);
#elif defined(__ARM_FEATURE_DOTPROD)
  float32x4_t facc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < 4; ++v) facc[m][v] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ4Bytes;
    int32x4_t acc[MB][4];
    q4_dots_neon<MB>(wb, x + 32 * b, xs, acc);
    for (int v = 0; v < 4; ++v) {
      const float32x4_t dv = half4(wb + 256 + 8 * v), mv = half4(wb + 256 + 2 * kBlock + 8 * v);
      for (int m = 0; m < MB; ++m) {
        facc[m][v] = vfmaq_f32(facc[m][v], vcvtq_f32_s32(acc[m][v]), vmulq_n_f32(dv, sx[m * sxs + b]));
        facc[m][v] = vfmaq_f32(facc[m][v], mv, vdupq_n_f32(sxq[m * sxs + b]));
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#else
  float facc[MB][kBlock] = {};
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ4Bytes;
    float dv[kBlock], mv[kBlock];
    for (int i = 0; i < kBlock; ++i) {
      uint16_t dh, mh;
      std::memcpy(&dh, wb + 256 + 2 * i, 2);
      std::memcpy(&mh, wb + 256 + 2 * kBlock + 2 * i, 2);
      dv[i] = static_cast<float>(c10::Half(dh, c10::Half::from_bits()));
      mv[i] = static_cast<float>(c10::Half(mh, c10::Half::from_bits()));
    }
    for (int m = 0; m < MB; ++m) {
      int32_t acc[kBlock] = {};
      for (int j = 0; j < 4; ++j)
        for (int o = 0; o < kBlock; ++o)
          for (int i = 0; i < 4; ++i) {
            const uint8_t v = wb[64 * j + 4 * o + i];
            acc[o] += static_cast<int32_t>(v & 0x0F) * x[m * xs + 32 * b + 4 * j + i] +
                      static_cast<int32_t>(v >> 4) * x[m * xs + 32 * b + 16 + 4 * j + i];
          }
      for (int o = 0; o < kBlock; ++o) {  // the VNNI path's two fused multiply-adds, in its order: the
        // same bits whatever the tile's rows (left to the compiler, the contraction followed the tile)
        facc[m][o] = std::fma(static_cast<float>(acc[o]), dv[o] * sx[m * sxs + b], facc[m][o]);
        facc[m][o] = std::fma(mv[o], sxq[m * sxs + b], facc[m][o]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#endif
}

#if defined(__AVX512VNNI__)
constexpr int kQ4Rows = 8;  // rows of a tile: 8 integer and 8 float accumulators stay in registers
#elif defined(__ARM_FEATURE_DOTPROD)
constexpr int kQ4Rows = 2;  // NEON's 32 registers hold 2 rows' 4 integer and 4 float accumulators beside the codes
#else
constexpr int kQ4Rows = 3;  // AVX2's 16 registers: 2 integer and 2 float accumulators a row
#endif

template <typename out_t>
void w4a8_run(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* SX,
              const float* SXQ, out_t* Y, int64_t NBk) {
  const int64_t ys = NBk * kBlock;
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nb = begin; nb < end; ++nb) {
      const uint8_t* w = W + nb * KB * kQ4Bytes;
      out_t* out = Y + nb * kBlock;
      for (int64_t m = 0; m < M; m += kQ4Rows) {
        const int64_t r = std::min<int64_t>(kQ4Rows, M - m);
        const int8_t* xr = X + m * xs;
        const float *s = SX + m * KB, *sq = SXQ + m * KB;
        out_t* yr = out + m * ys;
        with_rows<kQ4Rows>(r, [&](auto mb) { w4a8_tile<decltype(mb)::value>(xr, xs, KB, w, s, sq, KB, yr, ys); });
      }
    }
  });
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// x (M, K) float/bf16; packed = pack_q4 of (N, K) codes -> (M, N) in x's dtype
Tensor linear_w4a8(const Tensor& x, const Tensor& packed, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "linear_w4a8: (M, K) CPU rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_w4a8: float or bf16 rows");
  check_input(packed, "linear_w4a8: packed", at::kByte, 3);
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), KB = packed.size(1), Kp = KB * kQBlock;
  TORCH_CHECK((K + kQBlock - 1) / kQBlock == KB && packed.size(2) == kQ4Bytes && N >= 0 && N <= NBk * kBlock,
              "linear_w4a8: x does not match the packed weight");
  const QuantizedRows& q = quantized_rows(x, Kp, KB);
  thread_local std::vector<float> sxq;
  sxq.resize(M * KB);
  for (int64_t i = 0; i < M * KB; ++i) sxq[i] = q.sx[i] * static_cast<float>(q.xc[i] / 128);  // scale x block sum
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  if (x.scalar_type() == at::kFloat)
    w4a8_run<float>(q.xq.data(), M, Kp, KB, W, q.sx.data(), sxq.data(), y.data_ptr<float>(), NBk);
  else
    w4a8_run<at::BFloat16>(q.xq.data(), M, Kp, KB, W, q.sx.data(), sxq.data(), y.data_ptr<at::BFloat16>(), NBk);
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}
#endif

}  // namespace
