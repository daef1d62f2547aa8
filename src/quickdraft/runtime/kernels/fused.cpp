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
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

using at::Tensor;

namespace {

constexpr int64_t kGrain = 1 << 16;  // elements of work below which a loop stays on one thread

// Every tensor a kernel indexes is checked first (a clear error to Python, never a read out of bounds):
// on the CPU, of the dtype the kernel reads it as, contiguous, with the dimensions it indexes.
inline void check_input(const Tensor& t, const char* what, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK(t.defined() && t.device().is_cpu(), what, ": expected a CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, what, ": dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.dim() == dim && t.is_contiguous(), what, ": expected a contiguous ", dim, "-d tensor, got ", t.sizes());
}

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
  check_input(x, "add_rms_norm: x", x.scalar_type(), 2);
  check_input(w, "add_rms_norm: w", x.scalar_type(), 1);
  TORCH_CHECK(w.size(0) == x.size(1), "add_rms_norm: w has ", w.size(0), " weights for rows of ", x.size(1));
  const bool add = h.has_value() && h->defined();
  Tensor hc = add ? h->contiguous() : Tensor();
  if (add) {
    check_input(hc, "add_rms_norm: h", x.scalar_type(), 2);
    TORCH_CHECK(hc.sizes() == x.sizes(), "add_rms_norm: h ", hc.sizes(), " against x ", x.sizes());
  }
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
  check_input(y, "rope_store: y", y.scalar_type(), 2);
  check_input(cos, "rope_store: cos", y.scalar_type(), 2);
  check_input(sin, "rope_store: sin", y.scalar_type(), 2);
  check_input(k_cache, "rope_store: k_cache", y.scalar_type(), 3);
  check_input(v_cache, "rope_store: v_cache", y.scalar_type(), 3);
  const int64_t T = y.size(0), d = cos.size(1), half = d / 2;
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "rope_store: heads ", heads, ", kv heads ", kv_heads);
  TORCH_CHECK(d > 0 && d % 2 == 0 && cos.size(0) == T && sin.sizes() == cos.sizes(), "rope_store: cos, sin (T, d)");
  TORCH_CHECK(y.size(1) == (heads + 2 * kv_heads) * d, "rope_store: qkv width");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(0) == kv_heads && k_cache.size(2) == d,
              "rope_store: caches (kv heads, capacity, d)");
  TORCH_CHECK(at >= 0 && at + T <= k_cache.size(1), "rope_store: positions ", at, "..", at + T, " beyond the cache");
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

#if defined(__AVX512F__)
// ---- attention with AVX-512, a kv head's query rows at a time -------------------------------------------
// Scores of 16 keys at a time: d/16 FMAs a key into a vector of partial sums, then one shuffle tree turns 16
// such vectors into 16 scores (about 3 instructions a key, where a reduction per key takes 8). Each row's
// arithmetic is fixed (a key's score is the same tree over its own partial sums wherever it falls; softmax
// and the values in key order, one key at a time), whatever the rows beside it: batch-invariant, as the
// generic kernel below.
inline __m512 load16f(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16f(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The lane sums of 16 vectors, as one vector (lane j: the sum of a[j]'s lanes). Every output is the same
// fixed tree of additions over its own vector's lanes, whatever its place among the 16 (or the others).
inline __m512 lane_sums16(__m512 a[16]) {
  __m512 b[8], c[4];
  for (int k = 0; k < 8; ++k)
    b[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  for (int k = 0; k < 4; ++k)
    c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44), _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
  const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
}

// fast_exp over 16 lanes with explicit instructions (the same range reduction and polynomial)
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

template <typename scalar_t, int D16>
void attend_group_rows(const scalar_t* Qp, const scalar_t* Kg, const scalar_t* Vg, const bool* M, scalar_t* O,
                       int64_t heads, int64_t group, int64_t g, int64_t r0, int64_t r1, int64_t length, float scale) {
  constexpr int64_t d = 16 * D16;
  const int64_t padded = (length + 15) / 16 * 16;
  thread_local std::vector<float> p, keep;
  p.resize(padded);
  keep.resize(padded);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r / group, h = g * group + r % group;
    __m512 q[D16];
    for (int c = 0; c < D16; ++c) q[c] = _mm512_mul_ps(load16f(Qp + (t * heads + h) * d + 16 * c), sc);
    for (int64_t j0 = 0; j0 < length; j0 += 16) {  // scores of 16 keys at a time (a short block: zeros)
      __m512 part[16];
      for (int jj = 0; jj < 16; ++jj) {
        const int64_t j = j0 + jj;
        if (j >= length) {
          part[jj] = _mm512_setzero_ps();
          continue;
        }
        const scalar_t* kr = Kg + j * d;
        __m512 acc = _mm512_mul_ps(q[0], load16f(kr));
        for (int c = 1; c < D16; ++c) acc = _mm512_fmadd_ps(q[c], load16f(kr + 16 * c), acc);
        part[jj] = acc;
      }
      _mm512_storeu_ps(p.data() + j0, lane_sums16(part));
    }
    const bool* mrow = M ? M + t * length : nullptr;
    for (int64_t j = 0; j < padded; ++j) keep[j] = (j >= length || (mrow && !mrow[j])) ? 0.f : 1.f;
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) best = keep[j] != 0.f ? std::max(best, p[j]) : best;
    // 16 keys at a time through the vector exp: a key's probability does not depend on how many keys
    // the call holds (a compiler-vectorized loop over `length` would take its tail keys another way)
    const __m512 top = _mm512_set1_ps(best);
    for (int64_t j0 = 0; j0 < padded; j0 += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.data() + j0), top));
      _mm512_storeu_ps(p.data() + j0, _mm512_mul_ps(e, _mm512_loadu_ps(keep.data() + j0)));  // masked: 0
    }
    float total = 0.f;
    __m512 acc[D16];
    for (int c = 0; c < D16; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < length; ++j) {  // values summed in key order, one key at a time
      total += p[j];
      const __m512 e = _mm512_set1_ps(p[j]);
      const scalar_t* vr = Vg + j * d;
      for (int c = 0; c < D16; ++c) acc[c] = _mm512_fmadd_ps(e, load16f(vr + 16 * c), acc[c]);
    }
    alignas(64) float out[d];
    for (int c = 0; c < D16; ++c) _mm512_store_ps(out + 16 * c, acc[c]);
    scalar_t* o = O + t * heads * d + h * d;
    for (int64_t i = 0; i < d; ++i) o[i] = static_cast<scalar_t>(out[i] / total);
  }
}

template <typename scalar_t>
bool attend_avx512(const scalar_t* Qp, const scalar_t* Kp, const scalar_t* Vp, const bool* M, scalar_t* O, int64_t T,
                   int64_t heads, int64_t kv, int64_t d, int64_t cap, int64_t length) {
  if (d != 64 && d != 128 && d != 256) return false;
  // tasks: a kv head's rows (row x head of its group) in chunks, about 8 tasks a call, at most 16 rows each
  const int64_t group = heads / kv, rows = T * group;
  const int64_t chunk = std::min<int64_t>(16, std::max<int64_t>(1, (rows * kv + 7) / 8));
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  at::parallel_for(0, kv * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / chunks, r0 = (task % chunks) * chunk, r1 = std::min(rows, r0 + chunk);
      const scalar_t* Kg = Kp + g * cap * d;
      const scalar_t* Vg = Vp + g * cap * d;
      if (d == 64) attend_group_rows<scalar_t, 4>(Qp, Kg, Vg, M, O, heads, group, g, r0, r1, length, scale);
      else if (d == 128) attend_group_rows<scalar_t, 8>(Qp, Kg, Vg, M, O, heads, group, g, r0, r1, length, scale);
      else attend_group_rows<scalar_t, 16>(Qp, Kg, Vg, M, O, heads, group, g, r0, r1, length, scale);
    }
  });
  return true;
}
#endif

// q: (T, heads, d); k_cache, v_cache: (kv, capacity, d); the first `length` positions are attended to,
// under mask (T, length) bool when given (None: every row sees all). Returns (T, heads * d).
Tensor attend(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t length,
              const c10::optional<Tensor>& mask) {
  check_input(q, "attend: q", q.scalar_type(), 3);
  check_input(k_cache, "attend: k_cache", q.scalar_type(), 3);
  check_input(v_cache, "attend: v_cache", q.scalar_type(), 3);
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2), kv = k_cache.size(0), cap = k_cache.size(1);
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == d, "attend: caches (kv heads, capacity, d)");
  TORCH_CHECK(kv > 0 && heads % kv == 0 && length >= 1 && length <= cap, "attend: shapes");
  const bool masked = mask.has_value() && mask->defined();
  Tensor m = masked ? mask->to(at::kBool).contiguous() : Tensor();
  TORCH_CHECK(!masked || (m.dim() == 2 && m.size(0) == T && m.size(1) == length), "attend: mask must be (T, length)");
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
#if defined(__AVX512F__)
    if constexpr (!std::is_same_v<scalar_t, double>) {
      if (attend_avx512<scalar_t>(Qp, Kp, Vp, M, O, T, heads, kv, d, cap, length)) return;
    }
#endif
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, length * d));
    at::parallel_for(0, T * heads, grain, [&](int64_t begin, int64_t end) {
      const int64_t padded8 = (length + 7) / 8 * 8;
      std::vector<acc_t> p(padded8, acc_t(0)), keep(padded8, acc_t(0)), qf(d), acc(d);
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
        // in fixed blocks of 8 keys (padded with masked ones): every key goes through the same code
        // whatever `length` is (a vectorized loop over `length` takes its tail keys another way)
        for (int64_t j0 = 0; j0 < padded8; j0 += 8)
          for (int jj = 0; jj < 8; ++jj) p[j0 + jj] = fast_exp(p[j0 + jj] - best) * keep[j0 + jj];  // masked: 0
        // Sums in key order, one key at a time (the vectorized loop runs over the head dimension): a row's
        // result does not depend on how many keys or other rows the call holds (masked keys add zeros),
        // so a row verified among others equals the same row decoded alone, bit for bit.
        acc_t total = 0;
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t j = 0; j < length; ++j) {
          const scalar_t* vr = vb + j * d;
          const acc_t e = p[j];
          total += e;
          for (int64_t i = 0; i < d; ++i) acc[i] += e * static_cast<acc_t>(vr[i]);
        }
        scalar_t* o = O + t * heads * d + h * d;
        for (int64_t i = 0; i < d; ++i) o[i] = static_cast<scalar_t>(acc[i] / total);
      }
    });
  });
  return out;
}

// (T, 2 I) fused gate|up rows -> (T, I) act(gate) * up, act rounded to the dtype before the product
// (as torch's activation, then its multiply); row by row, so batch-invariant
template <typename Act>
Tensor gated_mul(const Tensor& gu, const char* name, Act act) {
  TORCH_CHECK(gu.device().is_cpu() && gu.dim() == 2 && gu.is_contiguous() && gu.size(1) % 2 == 0, name,
              ": contiguous (T, 2I) CPU rows");
  const int64_t T = gu.size(0), I = gu.size(1) / 2;
  Tensor out = at::empty({T, I}, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, gu.scalar_type(), "gated_mul", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* G = gu.data_ptr<scalar_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, T, std::max<int64_t>(1, kGrain / I), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* g = G + t * 2 * I;
        const scalar_t* u = g + I;
        for (int64_t i = 0; i < I; ++i) {
          const scalar_t a = static_cast<scalar_t>(act(static_cast<acc_t>(g[i])));
          O[t * I + i] = static_cast<scalar_t>(static_cast<acc_t>(a) * static_cast<acc_t>(u[i]));
        }
      }
    });
  });
  return out;
}

// silu(gate) * up
Tensor silu_mul(const Tensor& gu) {
  return gated_mul(gu, "silu_mul", [](auto x) {
    using acc_t = decltype(x);
    return x / (acc_t(1) + fast_exp(-x));
  });
}

// gelu_tanh(gate) * up (Gemma's GeGLU), tanh(y) = 1 - 2 / (e^{2y} + 1) with the same fast exp
Tensor gelu_tanh_mul(const Tensor& gu) {
  return gated_mul(gu, "gelu_tanh_mul", [](auto x) {
    using acc_t = decltype(x);
    const acc_t c = static_cast<acc_t>(0.7978845608028654), k = static_cast<acc_t>(0.044715);
    acc_t y = c * (x + k * x * x * x);
    y = std::min(std::max(y, acc_t(-20)), acc_t(20));  // tanh is +-1 to float precision beyond
    return acc_t(0.5) * x * (acc_t(1) + (acc_t(1) - acc_t(2) / (fast_exp(acc_t(2) * y) + acc_t(1))));
  });
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
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pack_bf16: a (N, K) bf16 CPU weight");
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t NBk = (N + kBlock - 1) / kBlock, K2 = (K + 1) / 2;
  Tensor padded = at::zeros({NBk * kBlock, K2 * 2}, weight.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
  return padded.view({NBk, kBlock, K2, 2}).permute({0, 2, 1, 3}).contiguous();
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

// ---- int8 weights x int8 activations in blocks of 32 (W8A8, as llama.cpp's Q8_0 x Q8_0) on VNNI -------
// Weights: int8 with one float scale per output and block of 32 inputs, stored shifted by 128 (unsigned);
// activations: quantized per row and block of 32 on the fly (absmax / 127, signed). pack_int8 lays the
// weights out as (N/16, K/4, 16, 4): one vpdpbusd multiplies 16 outputs' unsigned weight quads by a
// broadcast quad of signed activations (64 multiply-adds an instruction, twice bf16's, at half its
// weight bytes). Each block's int32 sums lose the shift with the activations' block sum (one scalar per
// row and block), then are converted and scaled:
// y[m, n] = sum_b s_x[m, b] s_w[n, b] (sum_{k in b} (q + 128) x_q - 128 sum_{k in b} x_q).
constexpr int kQBlock = 32;  // inputs per scale block

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
    for (int n = 0; n < NB; ++n) {
      if constexpr (std::is_same_v<out_t, float>) {
        _mm512_storeu_ps(y + m * ys + n * kBlock, facc[m][n]);
      } else {
#if defined(__AVX512BF16__)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ys + n * kBlock), (__m256i)_mm512_cvtneps_pbh(facc[m][n]));
#else
        alignas(64) float tmp[kBlock];
        _mm512_store_ps(tmp, facc[m][n]);
        for (int i = 0; i < kBlock; ++i) *reinterpret_cast<uint16_t*>(y + m * ys + n * kBlock + i) = float_to_bf16(tmp[i]);
#endif
      }
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
        for (int i = 0; i < kBlock; ++i)
          facc[m][n][i] += static_cast<float>(acc[i] - xc[m * sxs + b]) *
                           static_cast<float>(ws[n * ss + b * kBlock + i]) * sx[m * sxs + b];
      }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n)
      for (int i = 0; i < kBlock; ++i) {
        if constexpr (std::is_same_v<out_t, float>) {
          y[m * ys + n * kBlock + i] = facc[m][n][i];
        } else {
          *reinterpret_cast<uint16_t*>(y + m * ys + n * kBlock + i) = float_to_bf16(facc[m][n][i]);
        }
      }
#endif
}

template <int NB, typename out_t>
inline void w8a8_rows(const int8_t* x, int64_t M, int64_t xs, int64_t KB, const uint8_t* w, int64_t bs,
                      const float* ws, int64_t ss, const float* sx, const int32_t* xc, int64_t sxs, out_t* y,
                      int64_t ys) {
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
  float buf[kQBlock];
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < KB; ++b) {
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
    }
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
  for (int64_t n = 0; n < N; ++n) {
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
  return out;
}

template <int MB, typename out_t>
inline void w4a8_tile(const int8_t* x, int64_t xs, int64_t KB, const uint8_t* w, const float* sx, const float* sxq,
                      int64_t sxs, out_t* y, int64_t ys) {
#if defined(__AVX512VNNI__)
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 facc[MB];
  for (int m = 0; m < MB; ++m) facc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* wb = w + b * kQ4Bytes;
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
  for (int m = 0; m < MB; ++m) {
    if constexpr (std::is_same_v<out_t, float>) {
      _mm512_storeu_ps(y + m * ys, facc[m]);
    } else {
#if defined(__AVX512BF16__)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ys), (__m256i)_mm512_cvtneps_pbh(facc[m]));
#else
      alignas(64) float tmp[kBlock];
      _mm512_store_ps(tmp, facc[m]);
      for (int i = 0; i < kBlock; ++i) *reinterpret_cast<uint16_t*>(y + m * ys + i) = float_to_bf16(tmp[i]);
#endif
    }
  }
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
  for (int m = 0; m < MB; ++m)
    for (int o = 0; o < kBlock; ++o) {
      if constexpr (std::is_same_v<out_t, float>) {
        y[m * ys + o] = facc[m][o];
      } else {
        *reinterpret_cast<uint16_t*>(y + m * ys + o) = float_to_bf16(facc[m][o]);
      }
    }
#endif
}

constexpr int kQ4Rows = 8;  // rows of a tile: 8 integer and 8 float accumulators stay in registers

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
        switch (r) {
          case 8: w4a8_tile<8>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          case 7: w4a8_tile<7>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          case 6: w4a8_tile<6>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          case 5: w4a8_tile<5>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          case 4: w4a8_tile<4>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          case 3: w4a8_tile<3>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          case 2: w4a8_tile<2>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
          default: w4a8_tile<1>(xr, xs, KB, w, s, sq, KB, yr, ys); break;
        }
      }
    }
  });
}

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

// ---- plain Llama blocks, one call for a run of layers ------------------------------------------------------
// What llama_block.Block._fused_forward does layer by layer from Python, without Python between the
// kernels (measured on an AMD EPYC, 2 threads: about 0.7 ms of a 4.4 ms w4a8 step was Python and small
// torch ops). The same kernels in the same order, so the same bits. A linear is (kind, a, b, out):
// kind 0 = linear_packed(a), 1 = linear_w8a8(a, scales b), 2 = linear_w4a8(a).
Tensor run_linear(const Tensor& x, int64_t kind, const Tensor& a, const Tensor& b, int64_t out) {
  switch (kind) {
    case 0: return linear_packed(x, a, out);
    case 1: return linear_w8a8(x, a, b, out);
    case 2: return linear_w4a8(x, a, out);
    default: TORCH_CHECK(false, "llama_layers: unknown linear kind ", kind);
  }
}

// x (T, H); per layer l of [first, first + count): norms[2l], norms[2l + 1] (attention, MLP) and four
// linears at 4l.. (qkv fused, o, gate|up fused, down); k_all, v_all (layers, kv, capacity, d) the cache;
// rows written at `at`, RoPE tables cos, sin (T, d), mask (T, at + T) or none -> x after the layers.
Tensor llama_layers(Tensor x, const std::vector<Tensor>& norms, const std::vector<int64_t>& kinds,
                    const std::vector<Tensor>& wa, const std::vector<Tensor>& wb, const std::vector<int64_t>& outs,
                    const Tensor& k_all, const Tensor& v_all, int64_t first, int64_t at, const Tensor& cos,
                    const Tensor& sin, const c10::optional<Tensor>& mask, int64_t heads, int64_t kv_heads, double eps) {
  const int64_t count = static_cast<int64_t>(norms.size()) / 2, T = x.size(0);
  TORCH_CHECK(kinds.size() == 4 * norms.size() / 2 && wa.size() == kinds.size() && wb.size() == kinds.size() &&
              outs.size() == kinds.size(), "llama_layers: four linears and two norms a layer");
  check_input(k_all, "llama_layers: k_all", k_all.scalar_type(), 4);
  check_input(v_all, "llama_layers: v_all", k_all.scalar_type(), 4);
  TORCH_CHECK(k_all.sizes() == v_all.sizes() && first >= 0 && first + count <= k_all.size(0),
              "llama_layers: layers ", first, "..", first + count, " beyond the cache's ", k_all.size(0));
  x = x.contiguous();
  const c10::optional<Tensor> none;
  for (int64_t l = 0; l < count; ++l) {
    const Tensor kc = k_all.select(0, first + l), vc = v_all.select(0, first + l);
    const int64_t i = 4 * l;
    const Tensor h = add_rms_norm(x, none, norms[2 * l], eps)[1];
    const Tensor y = run_linear(h, kinds[i], wa[i], wb[i], outs[i]);
    const Tensor q = rope_store(y, cos, sin, kc, vc, at, heads, kv_heads);
    const Tensor o = attend(q, kc, vc, at + T, mask);
    const std::vector<Tensor> r = add_rms_norm(x, run_linear(o, kinds[i + 1], wa[i + 1], wb[i + 1], outs[i + 1]),
                                               norms[2 * l + 1], eps);
    const Tensor m = silu_mul(run_linear(r[1], kinds[i + 2], wa[i + 2], wb[i + 2], outs[i + 2]));
    x = at::add(r[0], run_linear(m, kinds[i + 3], wa[i + 3], wb[i + 3], outs[i + 3]));
  }
  return x;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "optional residual add, then RMSNorm (HF's arithmetic)");
  m.def("rope_store", &rope_store, "RoPE on q and k of fused qkv rows; k, v written to the layer's cache");
  m.def("attend", &attend, "attention of T rows over the first L cached positions (GQA, optional mask)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up over fused gate|up rows");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "gelu_tanh(gate) * up over fused gate|up rows (GeGLU)");
  m.def("pack_bf16", &pack_bf16, "a (N, K) bf16 weight in linear_packed's layout (N/16, K/2, 16, 2)");
  m.def("linear_packed", &linear_packed, "x W^T for bf16 rows over a pack_bf16 weight (AVX512-BF16 where present)");
  m.def("pack_int8", &pack_int8, "(N, K) int8 weights in linear_w8a8's layout (N/16, K/4, 16, 4), K padded to 32");
  m.def("pack_blocks", &pack_blocks, "(N, K/32) per-block scales in linear_w8a8's layout (N/16, K/32, 16)");
  m.def("linear_w8a8", &linear_w8a8, "x W^T with int8 weights and per-row int8 activations (VNNI where present)");
  m.def("pack_q4", &pack_q4, "(N, K) 4-bit codes with (N, K/32) scales and mins in linear_w4a8's layout (N/16, K/32, 320)");
  m.def("linear_w4a8", &linear_w4a8, "x W^T with 4-bit weights (q d + m) and per-row int8 activations (VNNI)");
  m.def("llama_layers", &llama_layers, "plain Llama blocks over one sequence's rows, one call (the kernels above)");
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
