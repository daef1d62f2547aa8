// pack_q6 / linear_w6a8: a GGUF's Q6_K weights as stored (6-bit codes, an int8 scale per 16 inputs, an
// fp16 scale per 256) x int8 activations (VNNI where present). Python: runtime/quant/w6a8.py.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "w8a8.h"
#include "w4a8.h"

namespace {

// ---- Q6_K weights x int8 activations in blocks of 32 on VNNI ------------------------------------------------
// Weights: w = d sc_j (q - 32), q a code 0..63, sc_j an int8 scale per output and 16 inputs, d an fp16
// scale per output and 256 inputs (Q6_K's super-block). pack_q6 lays them out as (N/16, K/32, 448)
// bytes: for each 16 outputs and block of 32 inputs, the codes' low 4 bits as pack_q4's four 64-byte
// quads (byte 64 j + 4 o + i: input 4 j + i in the low nibble, 16 + 4 j + i in the high one), then two
// 64-byte vectors of their high 2 bits (byte 4 o + i, bits 2 j and 2 j + 1: inputs 4 j + i, then
// 16 + 4 j + i), the 16 outputs' sc of the block's two halves (int8) and their d (fp16): 7 bits a weight,
// against w8a8's 9. A block's halves are Q6_K's sub-blocks, so each has its own integer sum, started at
// -32 times the activations' half-block sum (the codes' offset), then y[r, n] = sum_b s_x[r, b] (d sc_hi
// acc_hi + d sc_lo acc_lo) in one float order for every row: batch-invariant, as linear_w4a8.
constexpr int64_t kQ6Bytes = 4 * 64 + 2 * 64 + 2 * kBlock + 2 * kBlock;
constexpr int64_t kQ6Ahead = 16 * kQ6Bytes;  // bytes fetched ahead of the block being multiplied
#if defined(__AVX512VNNI__)
constexpr int kQ6Rows = 6;  // rows of a tile: 3 accumulators a row and 9 temporaries in the 32 registers
#elif defined(__ARM_FEATURE_DOTPROD)
constexpr int kQ6Rows = 2;  // NEON: smmla's two rows
#else
constexpr int kQ6Rows = 3;  // AVX2's 16 registers
#endif

// one output o's super-block s (8 blocks of 32) in pack_q6's layout: its 256 codes 0..63, 16 scales and
// d as fp16 bits
inline void put_q6(uint8_t* O, int64_t KB, int64_t nb, int64_t o, int64_t s, const uint8_t* codes, const int8_t* sc,
                   uint16_t dh) {
  for (int c = 0; c < 8; ++c) {
    uint8_t* blk = O + (nb * KB + 8 * s + c) * kQ6Bytes;
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 4; ++i) {
        const uint8_t lo = codes[32 * c + 4 * j + i] & 0x3F, hi = codes[32 * c + 16 + 4 * j + i] & 0x3F;
        blk[64 * j + 4 * o + i] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        blk[256 + 4 * o + i] |= static_cast<uint8_t>((lo >> 4) << (2 * j));
        blk[320 + 4 * o + i] |= static_cast<uint8_t>((hi >> 4) << (2 * j));
      }
    blk[384 + o] = static_cast<uint8_t>(sc[2 * c]);
    blk[400 + o] = static_cast<uint8_t>(sc[2 * c + 1]);
    std::memcpy(blk + 416 + 2 * o, &dh, 2);
  }
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// codes (N, K) uint8 0..63, sc (N, K/16) int8, d (N, K/256) float, K a multiple of 256 -> (ceil(N/16), K/32, 448)
Tensor pack_q6(const Tensor& codes, const Tensor& sc, const Tensor& d) {
  check_input(codes, "pack_q6: codes", at::kByte, 2);
  check_input(sc, "pack_q6: sc", at::kChar, 2);
  check_input(d, "pack_q6: d", at::kFloat, 2);
  const int64_t N = codes.size(0), K = codes.size(1), KB = K / kQBlock, NBk = (N + kBlock - 1) / kBlock;
  TORCH_CHECK(K % 256 == 0 && sc.size(0) == N && sc.size(1) == K / 16 && d.size(0) == N && d.size(1) == K / 256,
              "pack_q6: (N, K) codes with K a multiple of 256, (N, K/16) sc and (N, K/256) d");
  Tensor out = at::zeros({NBk, KB, kQ6Bytes}, codes.options());
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const int8_t* S = sc.data_ptr<int8_t>();
  const float* D = d.data_ptr<float>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {  // each 16 outputs' bytes are their own
    for (int64_t n = begin * kBlock; n < std::min(N, end * kBlock); ++n)
      for (int64_t s = 0; s < K / 256; ++s)
        put_q6(O, KB, n / kBlock, n % kBlock, s, C + n * K + 256 * s, S + n * (K / 16) + 16 * s,
               half_bits(D[n * (K / 256) + s]));
  });
  return out;
}

// a GGUF Q6_K tensor's rows as stored, (N, K/256 x 210) uint8 (per 256 weights: 128 bytes of low
// nibbles, 64 of high bit pairs, 16 int8 scales, d in fp16; llama.cpp's dequantize_row_q6_K order)
// -> pack_q6's layout, in one pass (the same bytes as pack_q6 of the decoded parts)
Tensor pack_q6_gguf(const Tensor& raw) {
  check_input(raw, "pack_q6_gguf: raw", at::kByte, 2);
  TORCH_CHECK(raw.size(1) % 210 == 0, "pack_q6_gguf: (N, K/256 x 210) Q6_K rows");
  const int64_t N = raw.size(0), KS = raw.size(1) / 210, KB = 8 * KS, NBk = (N + kBlock - 1) / kBlock;
  Tensor out = at::zeros({NBk, KB, kQ6Bytes}, raw.options());
  const uint8_t* R = raw.data_ptr<uint8_t>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {
    uint8_t codes[256];
    for (int64_t n = begin * kBlock; n < std::min(N, end * kBlock); ++n)
      for (int64_t s = 0; s < KS; ++s) {
        const uint8_t* p = R + (n * KS + s) * 210;
        for (int half = 0; half < 2; ++half) {  // 128 weights: 64 nibble bytes, 32 bit-pair bytes
          const uint8_t *ql = p + 64 * half, *qh = p + 128 + 32 * half;
          uint8_t* c = codes + 128 * half;
          for (int l = 0; l < 32; ++l) {
            c[l] = static_cast<uint8_t>((ql[l] & 0x0F) | ((qh[l] & 3) << 4));
            c[32 + l] = static_cast<uint8_t>((ql[32 + l] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
            c[64 + l] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            c[96 + l] = static_cast<uint8_t>((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
        }
        uint16_t dh;
        std::memcpy(&dh, p + 208, 2);
        put_q6(O, KB, n / kBlock, n % kBlock, s, codes, reinterpret_cast<const int8_t*>(p + 192), dh);
      }
  });
  return out;
}
#endif


// one block's 16 outputs: t = (float)acc_hi * s_hi, then fma((float)acc_lo, s_lo, t), then fma(t, s_x, y)
template <int MB, typename out_t>
inline void w6a8_tile(const int8_t* x, int64_t xs, int64_t KB, const uint8_t* w, const float* sx, const int32_t* h16,
                      int64_t sxs, out_t* y, int64_t ys) {
#if defined(__AVX512VNNI__)
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  __m512 facc[MB];
  for (int m = 0; m < MB; ++m) facc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ6Bytes;
    if constexpr (MB > 1)
      for (int l = 0; l < kQ6Bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + kQ6Ahead + l), _MM_HINT_T0);
    __m512i lo_acc[MB], hi_acc[MB];
    for (int m = 0; m < MB; ++m) {  // the codes' offset of 32, taken back up front: -32 x each half's sum
      lo_acc[m] = _mm512_set1_epi32(-32 * h16[m * 2 * sxs + 2 * b]);
      hi_acc[m] = _mm512_set1_epi32(-32 * h16[m * 2 * sxs + 2 * b + 1]);
    }
    const __m512i h_lo = _mm512_loadu_si512(wb + 256), h_hi = _mm512_loadu_si512(wb + 320);
    const auto quad = [&](auto jc) {  // quad j of the block (j a constant: the shifts take immediates)
      constexpr int j = decltype(jc)::value;
      const __m512i v = _mm512_loadu_si512(wb + 64 * j);
      const __m512i lo = q6_codes<j>(v, h_lo, low4, bits45), hi = q6_codes<j>(_mm512_srli_epi16(v, 4), h_hi, low4, bits45);
      for (int m = 0; m < MB; ++m) {
        int32_t q0, q1;
        std::memcpy(&q0, x + m * xs + 32 * b + 4 * j, 4);
        std::memcpy(&q1, x + m * xs + 32 * b + 16 + 4 * j, 4);
        lo_acc[m] = _mm512_dpbusd_epi32(lo_acc[m], lo, _mm512_set1_epi32(q0));
        hi_acc[m] = _mm512_dpbusd_epi32(hi_acc[m], hi, _mm512_set1_epi32(q1));
      }
    };
    quad(std::integral_constant<int, 0>{}), quad(std::integral_constant<int, 1>{});
    quad(std::integral_constant<int, 2>{}), quad(std::integral_constant<int, 3>{});
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 416)));
    const __m512 s_lo = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 384)))));
    const __m512 s_hi = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 400)))));
    for (int m = 0; m < MB; ++m) {
      const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo_acc[m]), s_lo, _mm512_mul_ps(_mm512_cvtepi32_ps(hi_acc[m]), s_hi));
      facc[m] = _mm512_fmadd_ps(t, _mm512_set1_ps(sx[m * sxs + b]), facc[m]);
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#elif defined(__AVX2__)
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  __m256 facc[MB][2];
  for (int m = 0; m < MB; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ6Bytes;
    // fetched ahead at every tile height here, the one-row step too: without it AVX2's one-row call took longer
    // than its two-row one (stop 75's A/B in docs/benchmarks.md; the AVX-512 path gained nothing from it and
    // keeps fetching for taller tiles only)
    for (int l = 0; l < kQ6Bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + kQ6Ahead + l), _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) {  // each 8-output half in turn: its 4 accumulators a row fit the 16 registers
      __m256i lo_acc[MB], hi_acc[MB];
      for (int m = 0; m < MB; ++m) {
        lo_acc[m] = _mm256_set1_epi32(-32 * h16[m * 2 * sxs + 2 * b]);
        hi_acc[m] = _mm256_set1_epi32(-32 * h16[m * 2 * sxs + 2 * b + 1]);
      }
      const __m256i h_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + 32 * h));
      const __m256i h_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 320 + 32 * h));
      for (int j = 0; j < 4; j += 2) {  // two quads' int16 pairs at once: 2 x 2 x 63 x 127 < 2^15
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * j + 32 * h));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * (j + 1) + 32 * h));
        const __m256i lo0 = q6_codes_avx2(v0, h_lo, j, low4, bits45), lo1 = q6_codes_avx2(v1, h_lo, j + 1, low4, bits45);
        const __m256i hi0 = q6_codes_avx2(_mm256_srli_epi16(v0, 4), h_hi, j, low4, bits45), hi1 = q6_codes_avx2(_mm256_srli_epi16(v1, 4), h_hi, j + 1, low4, bits45);
        for (int m = 0; m < MB; ++m) {
          const int8_t* xm = x + m * xs + 32 * b;
          lo_acc[m] = dot_quads2(lo_acc[m], lo0, bcast4(xm + 4 * j), lo1, bcast4(xm + 4 * j + 4));
          hi_acc[m] = dot_quads2(hi_acc[m], hi0, bcast4(xm + 16 + 4 * j), hi1, bcast4(xm + 20 + 4 * j));
        }
      }
      const auto bytes8 = [&](int64_t off) {  // 8 signed bytes -> float
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb + off))));
      };
      const __m256 dv = half8(wb + 416 + 16 * h);
      const __m256 s_lo = _mm256_mul_ps(dv, bytes8(384 + 8 * h)), s_hi = _mm256_mul_ps(dv, bytes8(400 + 8 * h));
      for (int m = 0; m < MB; ++m) {
        const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo_acc[m]), s_lo, _mm256_mul_ps(_mm256_cvtepi32_ps(hi_acc[m]), s_hi));
        facc[m][h] = _mm256_fmadd_ps(t, _mm256_set1_ps(sx[m * sxs + b]), facc[m][h]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m][0], facc[m][1], y + m * ys);
#elif defined(__ARM_FEATURE_DOTPROD)
  float32x4_t facc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < 4; ++v) facc[m][v] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ6Bytes;
    int32x4_t lo_acc[MB][4], hi_acc[MB][4];
    for (int m = 0; m < MB; ++m)  // the codes' offset of 32, taken back up front: -32 x each half's sum
      for (int v = 0; v < 4; ++v) {
        lo_acc[m][v] = vdupq_n_s32(-32 * h16[m * 2 * sxs + 2 * b]);
        hi_acc[m][v] = vdupq_n_s32(-32 * h16[m * 2 * sxs + 2 * b + 1]);
      }
    int8x16_t lo[4][4], hi[4][4];
    q6_codes_neon(wb, lo, hi);
    dot16x16<MB>(lo, x + 32 * b, xs, lo_acc);
    dot16x16<MB>(hi, x + 32 * b + 16, xs, hi_acc);
    for (int v = 0; v < 4; ++v) {
      const float32x4_t dv = half4(wb + 416 + 8 * v);
      float32x4_t s_lo = vmulq_f32(dv, bytes4_s8(wb + 384 + 4 * v)), s_hi = vmulq_f32(dv, bytes4_s8(wb + 400 + 4 * v));
      asm volatile("" : "+w"(s_lo), "+w"(s_hi));  // each scale a product before it meets the sums
      for (int m = 0; m < MB; ++m) {
        const float32x4_t t = vfmaq_f32(vmulq_f32(vcvtq_f32_s32(hi_acc[m][v]), s_hi), vcvtq_f32_s32(lo_acc[m][v]), s_lo);
        facc[m][v] = vfmaq_f32(facc[m][v], t, vdupq_n_f32(sx[m * sxs + b]));
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#else
  float facc[MB][kBlock] = {};
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ6Bytes;
    float s_lo[kBlock], s_hi[kBlock];
    for (int o = 0; o < kBlock; ++o) {
      uint16_t dh;
      std::memcpy(&dh, wb + 416 + 2 * o, 2);
      const float dv = static_cast<float>(c10::Half(dh, c10::Half::from_bits()));
      s_lo[o] = dv * static_cast<float>(static_cast<int8_t>(wb[384 + o]));
      s_hi[o] = dv * static_cast<float>(static_cast<int8_t>(wb[400 + o]));
    }
    for (int m = 0; m < MB; ++m) {
      int32_t lo_acc[kBlock], hi_acc[kBlock];
      for (int o = 0; o < kBlock; ++o) {
        lo_acc[o] = -32 * h16[m * 2 * sxs + 2 * b];
        hi_acc[o] = -32 * h16[m * 2 * sxs + 2 * b + 1];
      }
      for (int j = 0; j < 4; ++j)
        for (int o = 0; o < kBlock; ++o)
          for (int i = 0; i < 4; ++i) {
            const uint8_t v = wb[64 * j + 4 * o + i];
            const int32_t ql = (v & 0x0F) | (((wb[256 + 4 * o + i] >> (2 * j)) & 3) << 4);
            const int32_t qh = (v >> 4) | (((wb[320 + 4 * o + i] >> (2 * j)) & 3) << 4);
            lo_acc[o] += ql * x[m * xs + 32 * b + 4 * j + i];
            hi_acc[o] += qh * x[m * xs + 32 * b + 16 + 4 * j + i];
          }
      for (int o = 0; o < kBlock; ++o) {  // the vector path's float order, whatever the tile's rows
        const float t = std::fma(static_cast<float>(lo_acc[o]), s_lo[o], static_cast<float>(hi_acc[o]) * s_hi[o]);
        facc[m][o] = std::fma(t, sx[m * sxs + b], facc[m][o]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) store16(facc[m], y + m * ys);
#endif
}

template <typename out_t>
void w6a8_run(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* SX,
              const int32_t* H16, out_t* Y, int64_t NBk) {
  const int64_t ys = NBk * kBlock, tiles = (M + kQ6Rows - 1) / kQ6Rows, rows = tiles ? (M + tiles - 1) / tiles : 0;
  at::parallel_for(0, NBk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nb = begin; nb < end; ++nb) {
      const uint8_t* w = W + nb * KB * kQ6Bytes;
      for (int64_t m = 0; m < M; m += rows) {  // tiles of equal rows (9 = 5 + 4, not 6 + 3)
        const int64_t r = std::min<int64_t>(rows, M - m);
        const int8_t* xr = X + m * xs;
        const float* s = SX + m * KB;
        const int32_t* h = H16 + m * 2 * KB;
        out_t* yr = Y + nb * kBlock + m * ys;
        with_rows<kQ6Rows>(r, [&](auto mb) { w6a8_tile<decltype(mb)::value>(xr, xs, KB, w, s, h, KB, yr, ys); });
      }
    }
  });
}

#if !defined(QUICKDRAFT_NO_TORCH)  // torch's glue: the tiles around it build without torch (scripts/arm_check.sh)
// x (M, K) float/bf16; packed = pack_q6 of (N, K) codes -> (M, N) in x's dtype
Tensor linear_w6a8(const Tensor& x, const Tensor& packed, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "linear_w6a8: (M, K) CPU rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_w6a8: float or bf16 rows");
  check_input(packed, "linear_w6a8: packed", at::kByte, 3);
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), KB = packed.size(1), Kp = KB * kQBlock;
  TORCH_CHECK(K == Kp && packed.size(2) == kQ6Bytes && N >= 0 && N <= NBk * kBlock,
              "linear_w6a8: x does not match the packed weight");
  const QuantizedRows& q = quantized_rows(x, Kp, KB);
  thread_local std::vector<int32_t> h16;  // each row's sum of codes over each half-block of 16
  h16.resize(M * 2 * KB);
  for (int64_t i = 0; i < M * 2 * KB; ++i) {
    int32_t s = 0;
    for (int k = 0; k < 16; ++k) s += q.xq[16 * i + k];
    h16[i] = s;
  }
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  if (x.scalar_type() == at::kFloat)
    w6a8_run<float>(q.xq.data(), M, Kp, KB, W, q.sx.data(), h16.data(), y.data_ptr<float>(), NBk);
  else
    w6a8_run<at::BFloat16>(q.xq.data(), M, Kp, KB, W, q.sx.data(), h16.data(), y.data_ptr<at::BFloat16>(), NBk);
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}
#endif

}  // namespace
