// Fused CPU kernels for the native block's small ops (models/kernels/__init__.py builds and loads them).
//
// A one-row step of a small model is dominated by per-op overhead, not arithmetic: torch.profiler on
// SmolLM2-135M showed flash SDPA at 142 us a call for one query row over 200 keys, and RMSNorm's six
// ops at 30 us (scripts/step_profile.py). These kernels do each of those as one call, row by row,
// with the arithmetic of the torch path they replace (float32 accumulation for bf16 and float32,
// float64 for float64):
//   add_rms_norm  optional residual add, then Hugging Face's RMSNorm (float32, weight after the cast)
//   rope_store    RoPE on the q and k heads of a fused qkv row, k and v written into the layer's cache
//   attend        attention of T query rows over the first L cached positions (GQA, optional mask)
//   silu_mul      SwiGLU's silu(gate) * up over a fused gate/up row
// Compiled with -march=native for the host that builds them (the build folder is keyed by the
// host's CPU flags), so the compiler's vectorization follows the CPU (AVX2, AVX-512).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

using at::Tensor;

namespace {

constexpr int64_t kGrain = 1 << 16;  // elements of work below which a loop stays on one thread

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

template <typename scalar_t>
void add_rms_norm_rows(const scalar_t* x, const scalar_t* h, const scalar_t* w, scalar_t* sum, scalar_t* out,
                       int64_t rows, int64_t dim, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / dim), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(dim);
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * dim;
      float ss = 0.f;
      for (int64_t i = 0; i < dim; ++i) {
        scalar_t v = h ? static_cast<scalar_t>(static_cast<acc_t>(xr[i]) + static_cast<acc_t>(h[r * dim + i])) : xr[i];
        if (sum) sum[r * dim + i] = v;
        float f = static_cast<float>(v);  // the norm runs in float32 whatever the dtype, as in HF
        buf[i] = f;
        ss += f * f;
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + static_cast<float>(eps));
      for (int64_t i = 0; i < dim; ++i) {
        scalar_t normed = static_cast<scalar_t>(buf[i] * inv);
        out[r * dim + i] = static_cast<scalar_t>(static_cast<acc_t>(w[i]) * static_cast<acc_t>(normed));
      }
    }
  });
}

// (T, H) x, optional (T, H) h, (H,) w -> [x + h (or an empty tensor), norm(x + h)]
std::vector<Tensor> add_rms_norm(const Tensor& x, const c10::optional<Tensor>& h, const Tensor& w, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && w.is_contiguous(), "add_rms_norm: contiguous (T, H) rows");
  const bool add = h.has_value() && h->defined();
  Tensor hc = add ? h->contiguous() : Tensor();
  Tensor sum = add ? at::empty_like(x) : Tensor();
  Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "add_rms_norm", [&] {
    add_rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), add ? hc.data_ptr<scalar_t>() : nullptr,
                                w.data_ptr<scalar_t>(), add ? sum.data_ptr<scalar_t>() : nullptr,
                                out.data_ptr<scalar_t>(), x.size(0), x.size(1), eps);
  });
  return {sum, out};
}

// y: (T, (heads + 2 kv) d) fused q|k|v rows; cos, sin: (T, d); k_cache, v_cache: (kv, capacity, d) of one
// layer. Rotates q and k (x cos + rotate_half(x) sin), writes k and v at positions at..at+T, returns q
// as (T, heads, d).
Tensor rope_store(const Tensor& y, const Tensor& cos, const Tensor& sin, Tensor k_cache, Tensor v_cache, int64_t at,
                  int64_t heads, int64_t kv_heads) {
  const int64_t T = y.size(0), d = cos.size(1), half = d / 2;
  TORCH_CHECK(y.is_contiguous() && cos.is_contiguous() && sin.is_contiguous(), "rope_store: contiguous inputs");
  TORCH_CHECK(y.size(1) == (heads + 2 * kv_heads) * d, "rope_store: qkv width");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && at + T <= k_cache.size(1), "rope_store: cache");
  Tensor q = at::empty({T, heads, d}, y.options());
  const int64_t cap = k_cache.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "rope_store", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* Y = y.data_ptr<scalar_t>();
    const scalar_t* C = cos.data_ptr<scalar_t>();
    const scalar_t* S = sin.data_ptr<scalar_t>();
    scalar_t* Q = q.data_ptr<scalar_t>();
    scalar_t* K = k_cache.data_ptr<scalar_t>();
    scalar_t* V = v_cache.data_ptr<scalar_t>();
    const int64_t width = (heads + 2 * kv_heads) * d;
    for (int64_t t = 0; t < T; ++t) {
      const scalar_t* row = Y + t * width;
      const scalar_t* c = C + t * d;
      const scalar_t* s = S + t * d;
      for (int64_t hd = 0; hd < heads + kv_heads; ++hd) {
        const scalar_t* x = row + hd * d;
        scalar_t* dst = hd < heads ? Q + (t * heads + hd) * d : K + ((hd - heads) * cap + at + t) * d;
        for (int64_t i = 0; i < d; ++i) {
          acc_t rot = i < half ? -static_cast<acc_t>(x[i + half]) : static_cast<acc_t>(x[i - half]);
          dst[i] = static_cast<scalar_t>(static_cast<acc_t>(x[i]) * static_cast<acc_t>(c[i]) +
                                         rot * static_cast<acc_t>(s[i]));
        }
      }
      for (int64_t g = 0; g < kv_heads; ++g) {
        const scalar_t* x = row + (heads + kv_heads + g) * d;
        std::copy(x, x + d, V + (g * cap + at + t) * d);
      }
    }
  });
  return q;
}

// q: (T, heads, d); k_cache, v_cache: (kv, capacity, d); the first `length` positions are attended to,
// under mask (T, length) bool when given (None: every row sees all). Returns (T, heads * d).
Tensor attend(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t length,
              const c10::optional<Tensor>& mask) {
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2), kv = k_cache.size(0), cap = k_cache.size(1);
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "attend: contiguous");
  TORCH_CHECK(length <= cap && heads % kv == 0, "attend: shapes");
  const bool masked = mask.has_value() && mask->defined();
  Tensor m = masked ? mask->to(at::kBool).contiguous() : Tensor();
  TORCH_CHECK(!masked || (m.size(0) == T && m.size(1) == length), "attend: mask must be (T, length)");
  Tensor out = at::empty({T, heads * d}, q.options());
  const int64_t group = heads / kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "attend", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* Qp = q.data_ptr<scalar_t>();
    const scalar_t* Kp = k_cache.data_ptr<scalar_t>();
    const scalar_t* Vp = v_cache.data_ptr<scalar_t>();
    const bool* M = masked ? m.data_ptr<bool>() : nullptr;
    scalar_t* O = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, length * d));
    at::parallel_for(0, T * heads, grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> p(length), keep(length), qf(d), acc(d);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / heads, h = task % heads, g = h / group;
        const scalar_t* qr = Qp + (t * heads + h) * d;
        for (int64_t i = 0; i < d; ++i) qf[i] = static_cast<acc_t>(qr[i]) * static_cast<acc_t>(scale);
        const scalar_t* kb = Kp + g * cap * d;
        const scalar_t* vb = Vp + g * cap * d;
        for (int64_t j = 0; j < length; ++j) {
          const scalar_t* kr = kb + j * d;
          acc_t s = 0;
          for (int64_t i = 0; i < d; ++i) s += qf[i] * static_cast<acc_t>(kr[i]);
          p[j] = s;
          keep[j] = (M && !M[t * length + j]) ? acc_t(0) : acc_t(1);
        }
        acc_t best = -std::numeric_limits<acc_t>::infinity();
        for (int64_t j = 0; j < length; ++j) best = keep[j] != 0 ? std::max(best, p[j]) : best;
        acc_t total = 0;
        for (int64_t j = 0; j < length; ++j) {  // masked keys weigh exactly 0
          p[j] = fast_exp(p[j] - best) * keep[j];
          total += p[j];
        }
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t j = 0; j < length; ++j) {
          const scalar_t* vr = vb + j * d;
          const acc_t e = p[j];
          for (int64_t i = 0; i < d; ++i) acc[i] += e * static_cast<acc_t>(vr[i]);
        }
        scalar_t* o = O + t * heads * d + h * d;
        for (int64_t i = 0; i < d; ++i) o[i] = static_cast<scalar_t>(acc[i] / total);
      }
    });
  });
  return out;
}

// (T, 2 I) fused gate|up rows -> (T, I) silu(gate) * up
Tensor silu_mul(const Tensor& gu) {
  TORCH_CHECK(gu.dim() == 2 && gu.is_contiguous() && gu.size(1) % 2 == 0, "silu_mul: contiguous (T, 2I)");
  const int64_t T = gu.size(0), I = gu.size(1) / 2;
  Tensor out = at::empty({T, I}, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, gu.scalar_type(), "silu_mul", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* G = gu.data_ptr<scalar_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, T, std::max<int64_t>(1, kGrain / I), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* g = G + t * 2 * I;
        const scalar_t* u = g + I;
        for (int64_t i = 0; i < I; ++i) {
          const acc_t x = static_cast<acc_t>(g[i]);
          const scalar_t silu = static_cast<scalar_t>(x / (acc_t(1) + fast_exp(-x)));  // rounded as F.silu
          O[t * I + i] = static_cast<scalar_t>(static_cast<acc_t>(silu) * static_cast<acc_t>(u[i]));
        }
      }
    });
  });
  return out;
}


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
  for (; m + 4 <= M; m += 4) packed_tile<4, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys);
  switch (M - m) {
    case 3: packed_tile<3, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys); break;
    case 2: packed_tile<2, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys); break;
    case 1: packed_tile<1, NB>(x + m * xs, xs, K2, w, bs, y + m * ys, ys); break;
    default: break;
  }
}

// (N, K) bf16 -> (ceil(N/16), ceil(K/2), 16, 2) bf16, zero-padded
Tensor pack_bf16(const Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "pack_bf16: a (N, K) bf16 weight");
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t NBk = (N + kBlock - 1) / kBlock, K2 = (K + 1) / 2;
  Tensor padded = at::zeros({NBk * kBlock, K2 * 2}, weight.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
  return padded.view({NBk, kBlock, K2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// x (M, K) bf16, packed from pack_bf16 of a (N, K) weight -> (M, N) bf16
Tensor linear_packed(const Tensor& x, const Tensor& packed, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && packed.dim() == 4, "linear_packed: bf16 rows");
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), K2 = packed.size(1);
  TORCH_CHECK((K + 1) / 2 == K2 && N <= NBk * kBlock, "linear_packed: x does not match the packed weight");
  Tensor xc = x.contiguous();
  if (K % 2) xc = at::constant_pad_nd(xc, {0, 1});
  const int64_t xs = xc.size(1);
  Tensor y = at::empty({M, NBk * kBlock}, x.options());
  const uint16_t* X = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const uint16_t* W = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  uint16_t* Y = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t bs = K2 * 2 * kBlock, ys = NBk * kBlock;
  constexpr int NB = 4;
  const int64_t groups = (NBk + NB - 1) / NB;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = g * NB, nb = std::min<int64_t>(NB, NBk - b0);
      const uint16_t* w = W + b0 * bs;
      uint16_t* out = Y + b0 * kBlock;
      switch (nb) {
        case 4: packed_rows<4>(X, M, xs, K2, w, bs, out, ys); break;
        case 3: packed_rows<3>(X, M, xs, K2, w, bs, out, ys); break;
        case 2: packed_rows<2>(X, M, xs, K2, w, bs, out, ys); break;
        default: packed_rows<1>(X, M, xs, K2, w, bs, out, ys); break;
      }
    }
  });
  return N == NBk * kBlock ? y : y.narrow(1, 0, N).contiguous();
}

// ---- int8 weights x int8 activations (W8A8) on VNNI ---------------------------------------------------
// pack_int8 lays (N, K) int8 weights out as (N/16, K/4, 16, 4): one vpdpbusd multiplies a broadcast
// quad of unsigned activations by 16 outputs' signed weight quads (64 multiply-adds an instruction,
// twice bf16's, at half the weight bytes). Activations are quantized per row on the fly (symmetric,
// absmax / 127) and shifted by 128 to be unsigned; the shift is taken back with the weights' column sums:
// y = s_x s_w (sum (x_q + 128) w_q - 128 sum w_q).

Tensor pack_int8(const Tensor& q) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar, "pack_int8: a (N, K) int8 weight");
  const int64_t N = q.size(0), K = q.size(1);
  const int64_t NBk = (N + kBlock - 1) / kBlock, K4 = (K + 3) / 4;
  Tensor padded = at::zeros({NBk * kBlock, K4 * 4}, q.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(q);
  return padded.view({NBk, kBlock, K4, 4}).permute({0, 2, 1, 3}).contiguous();
}

// Writes y[m, n] = (acc - 128 colsum[n]) xscale[m] wscale[n] in the output's type (float or bf16).
template <typename out_t>
inline void w8a8_store(float v, out_t* dst) {
  if constexpr (std::is_same_v<out_t, float>) {
    *dst = v;
  } else {
    *reinterpret_cast<uint16_t*>(dst) = float_to_bf16(v);
  }
}

template <int MB, int NB, typename out_t>
inline void w8a8_tile(const uint8_t* x, int64_t xs, int64_t K4, const int8_t* w, int64_t bs, const int32_t* cs,
                      const float* sw, const float* sx, out_t* y, int64_t ys) {
#if defined(__AVX512VNNI__)
  __m512i acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K4; ++k) {
    __m512i wv[NB];
    for (int n = 0; n < NB; ++n) wv[n] = _mm512_loadu_si512(w + n * bs + k * 4 * kBlock);
    for (int m = 0; m < MB; ++m) {
      int32_t quad;
      std::memcpy(&quad, x + m * xs + 4 * k, sizeof quad);
      const __m512i xv = _mm512_set1_epi32(quad);
      for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], xv, wv[n]);
    }
  }
  for (int n = 0; n < NB; ++n) {
    const __m512i shift = _mm512_slli_epi32(_mm512_loadu_si512(cs + n * kBlock), 7);  // 128 colsum
    const __m512 ws = _mm512_loadu_ps(sw + n * kBlock);
    for (int m = 0; m < MB; ++m) {
      const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m][n], shift)),
                                     _mm512_mul_ps(ws, _mm512_set1_ps(sx[m])));
      if constexpr (std::is_same_v<out_t, float>) {
        _mm512_storeu_ps(y + m * ys + n * kBlock, v);
      } else {
#if defined(__AVX512BF16__)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ys + n * kBlock), (__m256i)_mm512_cvtneps_pbh(v));
#else
        alignas(64) float tmp[kBlock];
        _mm512_store_ps(tmp, v);
        for (int i = 0; i < kBlock; ++i) w8a8_store(tmp[i], y + m * ys + n * kBlock + i);
#endif
      }
    }
  }
#else
  int32_t acc[MB][NB][kBlock] = {};
  for (int64_t k = 0; k < K4; ++k)
    for (int m = 0; m < MB; ++m) {
      const uint8_t* xk = x + m * xs + 4 * k;
      for (int n = 0; n < NB; ++n) {
        const int8_t* wk = w + n * bs + k * 4 * kBlock;
        for (int i = 0; i < kBlock; ++i)
          for (int j = 0; j < 4; ++j) acc[m][n][i] += static_cast<int32_t>(xk[j]) * static_cast<int32_t>(wk[4 * i + j]);
      }
    }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n)
      for (int i = 0; i < kBlock; ++i) {
        const int64_t c = n * kBlock + i;
        w8a8_store(static_cast<float>(acc[m][n][i] - 128 * cs[c]) * sx[m] * sw[c], y + m * ys + c);
      }
#endif
}

template <int NB, typename out_t>
inline void w8a8_rows(const uint8_t* x, int64_t M, int64_t xs, int64_t K4, const int8_t* w, int64_t bs,
                      const int32_t* cs, const float* sw, const float* sx, out_t* y, int64_t ys) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) w8a8_tile<4, NB>(x + m * xs, xs, K4, w, bs, cs, sw, sx + m, y + m * ys, ys);
  switch (M - m) {
    case 3: w8a8_tile<3, NB>(x + m * xs, xs, K4, w, bs, cs, sw, sx + m, y + m * ys, ys); break;
    case 2: w8a8_tile<2, NB>(x + m * xs, xs, K4, w, bs, cs, sw, sx + m, y + m * ys, ys); break;
    case 1: w8a8_tile<1, NB>(x + m * xs, xs, K4, w, bs, cs, sw, sx + m, y + m * ys, ys); break;
    default: break;
  }
}

// x (M, K) float/bf16; packed from pack_int8 of (N, K) int8 weights (N padded to 16 with zero rows), their
// column sums colsum and per-output scales (both padded to the packed rows) -> (M, N) in x's dtype
Tensor linear_w8a8(const Tensor& x, const Tensor& packed, const Tensor& colsum, const Tensor& scales, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && packed.scalar_type() == at::kChar, "linear_w8a8: shapes");
  const int64_t M = x.size(0), K = x.size(1), NBk = packed.size(0), K4 = packed.size(1);
  TORCH_CHECK((K + 3) / 4 == K4 && N <= NBk * kBlock, "linear_w8a8: x does not match the packed weight");
  TORCH_CHECK(colsum.numel() == NBk * kBlock && scales.numel() == NBk * kBlock, "linear_w8a8: padded sums/scales");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_w8a8: float or bf16 rows");
  const Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t xs = K4 * 4;
  std::vector<uint8_t> xq(M * xs, 128);
  std::vector<float> xscale(M);
  const float* X = xf.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {  // per-row symmetric int8, shifted to unsigned
    float amax = 0.f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(X[m * K + k]));
    const float s = amax > 0.f ? amax / 127.f : 1.f, inv = 1.f / s;
    xscale[m] = s;
    for (int64_t k = 0; k < K; ++k)
      xq[m * xs + k] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(X[m * K + k] * inv)) + 128);
  }
  const int64_t ys = NBk * kBlock, bs = K4 * 4 * kBlock;
  Tensor y = at::empty({M, ys}, x.options());
  const int8_t* W = packed.data_ptr<int8_t>();
  const int32_t* cs = colsum.data_ptr<int32_t>();
  const float* sw = scales.data_ptr<float>();
  constexpr int NB = 4;
  const int64_t groups = (NBk + NB - 1) / NB;
  AT_DISPATCH_SWITCH(x.scalar_type(), "linear_w8a8",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      float* Y = y.data_ptr<float>();
      at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
          const int64_t b0 = g * NB, nb = std::min<int64_t>(NB, NBk - b0), c = b0 * kBlock;
          const int8_t* w = W + b0 * bs;
          switch (nb) {
            case 4: w8a8_rows<4>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
            case 3: w8a8_rows<3>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
            case 2: w8a8_rows<2>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
            default: w8a8_rows<1>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
          }
        }
      });
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      at::BFloat16* Y = y.data_ptr<at::BFloat16>();
      at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
          const int64_t b0 = g * NB, nb = std::min<int64_t>(NB, NBk - b0), c = b0 * kBlock;
          const int8_t* w = W + b0 * bs;
          switch (nb) {
            case 4: w8a8_rows<4>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
            case 3: w8a8_rows<3>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
            case 2: w8a8_rows<2>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
            default: w8a8_rows<1>(xq.data(), M, xs, K4, w, bs, cs + c, sw + c, xscale.data(), Y + c, ys); break;
          }
        }
      });
    }));
  return N == ys ? y : y.narrow(1, 0, N).contiguous();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "optional residual add, then RMSNorm (HF's arithmetic)");
  m.def("rope_store", &rope_store, "RoPE on q and k of fused qkv rows; k, v written to the layer's cache");
  m.def("attend", &attend, "attention of T rows over the first L cached positions (GQA, optional mask)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up over fused gate|up rows");
  m.def("pack_bf16", &pack_bf16, "a (N, K) bf16 weight in linear_packed's layout (N/16, K/2, 16, 2)");
  m.def("linear_packed", &linear_packed, "x W^T for bf16 rows over a pack_bf16 weight (AVX512-BF16 where present)");
  m.def("pack_int8", &pack_int8, "(N, K) int8 weights in linear_w8a8's layout (N/16, K/4, 16, 4)");
  m.def("linear_w8a8", &linear_w8a8, "x W^T with int8 weights and per-row int8 activations (VNNI where present)");
  m.def("has_avx512_vnni", [] {
#if defined(__AVX512VNNI__)
    return true;
#else
    return false;
#endif
  });
  m.def("has_avx512_bf16", [] {
#if defined(__AVX512BF16__)
    return true;
#else
    return false;
#endif
  });
}
