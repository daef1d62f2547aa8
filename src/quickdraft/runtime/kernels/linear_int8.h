// pack_int8 / pack_blocks / linear_w8a8: int8 weights x int8 activations in blocks of 32 (VNNI where
// present), and the rows' int8 quantization shared with the 4-bit linear. Python: runtime/w8a8.py.
// A part of fused.cpp's one translation unit (included inside its anonymous namespace, after the
// shared helpers): not compiled alone.
#pragma once

// ---- int8 weights x int8 activations in blocks of 32 (W8A8, as llama.cpp's Q8_0 x Q8_0) on VNNI -------
// Weights: int8 with one float scale per output and block of 32 inputs, stored shifted by 128 (unsigned);
// activations: quantized per row and block of 32 on the fly (absmax / 127, signed). pack_int8 lays the
// weights out as (N/16, K/4, 16, 4): one vpdpbusd multiplies 16 outputs' unsigned weight quads by a
// broadcast quad of signed activations (64 multiply-adds an instruction, twice bf16's, at half its
// weight bytes). Each block's int32 sums lose the shift with the activations' block sum (one scalar per
// row and block), then are converted and scaled:
// y[m, n] = sum_b s_x[m, b] s_w[n, b] (sum_{k in b} (q + 128) x_q - 128 sum_{k in b} x_q).
constexpr int kQBlock = 32;  // inputs per scale block
constexpr int64_t kW8Ahead = 12 * kQBlock * kBlock;  // bytes fetched ahead of the block being multiplied

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
// AVX2 without VNNI (levels avx2 and avx512): 16 outputs as two 8-output halves of 256 bits, and
// vpdpbusd's products from two instructions: vpmaddubsw multiplies unsigned bytes by signed ones and adds
// pairs into int16, vpmaddwd adds pairs of those into int32. The int16 pairs are exact while a code is
// below 129 (2 x 128 x 127 < 2^15): 4- and 6-bit codes as they are, int8 weights after their sign has
// moved onto the activations. The integer sums are the VNNI path's, and the float steps its, in its order.
inline __m256i pairs_u8s8(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }  // int16 pair sums
inline __m256i quads_i16(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }  // to int32
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

template <int MB, int NB, typename out_t>
inline void w8a8_tile(const int8_t* x, int64_t xs, int64_t KB, const uint8_t* w, int64_t bs, const float* ws,
                      int64_t ss, const float* sx, const int32_t* xc, int64_t sxs, out_t* y, int64_t ys) {
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
            acc[m][n][h] = _mm256_add_epi32(acc[m][n][h], quads_i16(pairs_u8s8(wa[n][h], _mm256_sign_epi8(xv, wq[n][h]))));
      }
    }
    for (int n = 0; n < NB; ++n)
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_loadu_ps(ws + n * ss + b * kBlock + 8 * h);
        for (int m = 0; m < MB; ++m) {  // the sums are q x already: the VNNI path's shift is not there to take back
          const __m256 v = _mm256_cvtepi32_ps(acc[m][n][h]);
          facc[m][n][h] = _mm256_fmadd_ps(v, _mm256_mul_ps(scale, _mm256_set1_ps(sx[m * sxs + b])), facc[m][n][h]);
        }
      }
  }
  (void)xc;
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) store16(facc[m][n][0], facc[m][n][1], y + m * ys + n * kBlock);
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
        for (int i = 0; i < kBlock; ++i)
          facc[m][n][i] += static_cast<float>(acc[i] - xc[m * sxs + b]) *
                           static_cast<float>(ws[n * ss + b * kBlock + i]) * sx[m * sxs + b];
      }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) store16(facc[m][n], y + m * ys + n * kBlock);
#endif
}

template <int NB, typename out_t>
inline void w8a8_rows(const int8_t* x, int64_t M, int64_t xs, int64_t KB, const uint8_t* w, int64_t bs,
                      const float* ws, int64_t ss, const float* sx, const int32_t* xc, int64_t sxs, out_t* y,
                      int64_t ys) {
#if !defined(__AVX512VNNI__)
  if (M > 1) {  // 16 registers (AVX2): tiles of 2 rows
    int64_t m = 0;
    for (; m + 2 <= M; m += 2)
      w8a8_tile<2, NB>(x + m * xs, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys);
    if (m < M) w8a8_tile<1, NB>(x + m * xs, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys);
    return;
  }
#endif
  if (M == 5 || M == 6) {  // one pass over the weights (24 accumulators and the weights fit the 32 registers)
    if (M == 5) w8a8_tile<5, NB>(x, xs, KB, w, bs, ws, ss, sx, xc, sxs, y, ys);
    else w8a8_tile<6, NB>(x, xs, KB, w, bs, ws, ss, sx, xc, sxs, y, ys);
    return;
  }
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    w8a8_tile<4, NB>(x + m * xs, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys);
  const int64_t r = M - m;
  const int8_t* xr = x + m * xs;
  if (r == 3) w8a8_tile<3, NB>(xr, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys);
  if (r == 2) w8a8_tile<2, NB>(xr, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys);
  if (r == 1) w8a8_tile<1, NB>(xr, xs, KB, w, bs, ws, ss, sx + m * sxs, xc + m * sxs, sxs, y + m * ys, ys);
}

template <typename out_t>
void w8a8_run(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* WS,
              const float* SX, const int32_t* XC, out_t* Y, int64_t NBk) {
  constexpr int NB = 2;
  const int64_t bs = KB * kQBlock * kBlock, ss = KB * kBlock, ys = NBk * kBlock;
  const int64_t groups = (NBk + NB - 1) / NB;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = g * NB;
      const uint8_t* w = W + b0 * bs;
      const float* ws = WS + b0 * ss;
      out_t* out = Y + b0 * kBlock;
      if (NBk - b0 >= 2) w8a8_rows<2>(X, M, xs, KB, w, bs, ws, ss, SX, XC, KB, out, ys);
      else w8a8_rows<1>(X, M, xs, KB, w, bs, ws, ss, SX, XC, KB, out, ys);
    }
  });
}

// rows (M, K) -> per row and block of 32: symmetric int8 codes (row stride Kp), their scales and 128 x their sums
template <typename in_t>
void quantize_rows(const in_t* X, int64_t M, int64_t K, int64_t Kp, int64_t KB, int8_t* xq, float* sx, int32_t* xc) {
  const auto one = [&](int64_t m, int64_t b) {  // one row's block: independent of every other
    float buf[kQBlock];
    const int64_t k0 = b * kQBlock, n = std::min<int64_t>(K, k0 + kQBlock) - k0;
    float amax = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      buf[i] = static_cast<float>(X[m * K + k0 + i]);
      amax = std::max(amax, std::fabs(buf[i]));
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    sx[m * KB + b] = amax / 127.f;
    int32_t sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = static_cast<int32_t>(std::lrint(buf[i] * inv));  // inlined: no errno
      xq[m * Kp + k0 + i] = static_cast<int8_t>(v);
      sum += v;
    }
    xc[m * KB + b] = 128 * sum;
  };
  if (M == 1) {  // a one-row step: too little work to share
    for (int64_t b = 0; b < KB; ++b) one(0, b);
    return;
  }
  at::parallel_for(0, M * KB, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) one(i / KB, i % KB);
  });
}

// A call's rows quantized as `quantize_rows` does, into this thread's buffers (reused call after call):
// codes with row stride Kp (zero-padded), scales and 128 x block sums, (M, KB) each.
struct QuantizedRows {
  std::vector<int8_t> xq;
  std::vector<float> sx;
  std::vector<int32_t> xc;  // 128 x each block's sum of codes (w8a8: the weights' shift, taken back)
};

const QuantizedRows& quantized_rows(const Tensor& x, int64_t Kp, int64_t KB) {
  thread_local QuantizedRows q;
  const int64_t M = x.size(0), K = x.size(1);
  const Tensor xc = x.contiguous();
  q.xq.assign(M * Kp, 0);
  q.sx.resize(M * KB);
  q.xc.resize(M * KB);
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantized_rows",
    AT_DISPATCH_CASE(at::kFloat, [&] { quantize_rows(xc.data_ptr<float>(), M, K, Kp, KB, q.xq.data(), q.sx.data(), q.xc.data()); })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      quantize_rows(xc.data_ptr<at::BFloat16>(), M, K, Kp, KB, q.xq.data(), q.sx.data(), q.xc.data());
    }));
  return q;
}

// x (M, K) float/bf16; packed = pack_int8(q) of (N, K) int8 weights; scales = pack_blocks of their (N, K/32)
// float block scales -> (M, N) in x's dtype
Tensor linear_w8a8(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "linear_w8a8: (M, K) CPU rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_w8a8: float or bf16 rows");
  check_input(packed, "linear_w8a8: packed", at::kByte, 4);
  check_input(scales, "linear_w8a8: scales", at::kFloat, 3);
  TORCH_CHECK(packed.size(2) == kBlock && packed.size(3) == 4, "linear_w8a8: not a pack_int8 layout");
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), Kp = packed.size(1) * 4, KB = Kp / kQBlock;
  TORCH_CHECK(Kp % kQBlock == 0 && (K + kQBlock - 1) / kQBlock == KB && N >= 0 && N <= NBk * kBlock,
              "linear_w8a8: x does not match the weight");
  TORCH_CHECK(scales.size(0) == NBk && scales.size(1) == KB && scales.size(2) == kBlock, "linear_w8a8: scales");
  const QuantizedRows& q = quantized_rows(x, Kp, KB);
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  const float* WS = scales.data_ptr<float>();
  if (x.scalar_type() == at::kFloat)
    w8a8_run<float>(q.xq.data(), M, Kp, KB, W, WS, q.sx.data(), q.xc.data(), y.data_ptr<float>(), NBk);
  else
    w8a8_run<at::BFloat16>(q.xq.data(), M, Kp, KB, W, WS, q.sx.data(), q.xc.data(), y.data_ptr<at::BFloat16>(), NBk);
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}
