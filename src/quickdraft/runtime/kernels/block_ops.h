// The block's small ops, row by row in a fixed order (batch-invariant): add_rms_norm (optional residual
// add, then Hugging Face's RMSNorm), rope_store (RoPE on fused qkv rows, k and v into the cache) and the
// gated activations silu_mul / gelu_tanh_mul (SwiGLU, GeGLU). Python: runtime/forward/llama_block.py.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "common.h"

namespace {

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

// One fused q|k|v row at cache position `pos`: q and k rotated (x cos + rotate_half(x) sin), q into Q (heads,
// d), k and v into a layer's (kv, cap, d) caches K, V. rope_store's and attend_batch's (batch_attention.h).
template <typename scalar_t>
void rope_row(const scalar_t* row, const scalar_t* c, const scalar_t* s, scalar_t* Q, scalar_t* K, scalar_t* V,
              int64_t cap, int64_t pos, int64_t heads, int64_t kv_heads, int64_t d) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t half = d / 2;
  for (int64_t hd = 0; hd < heads + kv_heads; ++hd) {
    const scalar_t* x = row + hd * d;
    scalar_t* dst = hd < heads ? Q + hd * d : K + ((hd - heads) * cap + pos) * d;
    for (int64_t i = 0; i < d; ++i) {
      acc_t rot = i < half ? -static_cast<acc_t>(x[i + half]) : static_cast<acc_t>(x[i - half]);
      dst[i] = static_cast<scalar_t>(static_cast<acc_t>(x[i]) * static_cast<acc_t>(c[i]) + rot * static_cast<acc_t>(s[i]));
    }
  }
  for (int64_t g = 0; g < kv_heads; ++g) {
    const scalar_t* x = row + (heads + kv_heads + g) * d;
    std::copy(x, x + d, V + (g * cap + pos) * d);
  }
}

// y: (T, (heads + 2 kv) d) fused q|k|v rows; cos, sin: (T, d); k_cache, v_cache: (kv, capacity, d) of one
// layer. Rotates q and k, writes k and v at positions at..at+T (`rope_row`), returns q as (T, heads, d).
Tensor rope_store(const Tensor& y, const Tensor& cos, const Tensor& sin, Tensor k_cache, Tensor v_cache, int64_t at,
                  int64_t heads, int64_t kv_heads) {
  check_input(y, "rope_store: y", y.scalar_type(), 2);
  check_input(cos, "rope_store: cos", y.scalar_type(), 2);
  check_input(sin, "rope_store: sin", y.scalar_type(), 2);
  check_input(k_cache, "rope_store: k_cache", y.scalar_type(), 3);
  check_input(v_cache, "rope_store: v_cache", y.scalar_type(), 3);
  const int64_t T = y.size(0), d = cos.size(1);
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "rope_store: heads ", heads, ", kv heads ", kv_heads);
  TORCH_CHECK(d > 0 && d % 2 == 0 && cos.size(0) == T && sin.sizes() == cos.sizes(), "rope_store: cos, sin (T, d)");
  TORCH_CHECK(y.size(1) == (heads + 2 * kv_heads) * d, "rope_store: qkv width");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(0) == kv_heads && k_cache.size(2) == d,
              "rope_store: caches (kv heads, capacity, d)");
  TORCH_CHECK(at >= 0 && at + T <= k_cache.size(1), "rope_store: positions ", at, "..", at + T, " beyond the cache");
  Tensor q = at::empty({T, heads, d}, y.options());
  const int64_t cap = k_cache.size(1), width = (heads + 2 * kv_heads) * d;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "rope_store", [&] {
    const scalar_t *Y = y.data_ptr<scalar_t>(), *C = cos.data_ptr<scalar_t>(), *S = sin.data_ptr<scalar_t>();
    scalar_t *Q = q.data_ptr<scalar_t>(), *K = k_cache.data_ptr<scalar_t>(), *V = v_cache.data_ptr<scalar_t>();
    for (int64_t t = 0; t < T; ++t)
      rope_row<scalar_t>(Y + t * width, C + t * d, S + t * d, Q + t * heads * d, K, V, cap, at + t, heads, kv_heads, d);
  });
  return q;
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

}  // namespace
