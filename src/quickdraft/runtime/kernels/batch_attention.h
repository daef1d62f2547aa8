// attend_batch: RoPE, the cache write and attention of a batch's fused q|k|v rows, each sequence over its own
// cache row, in one call. Python: runtime/kernels/batch_attention.py (for runtime/forward/llama_block.py's
// batched forward, which made two calls a sequence and layer: their Python and thread start-ups grew with the
// batch). Each query row goes through the functions rope_store and attend run (rope_row; attend_group_rows or
// attend_one) with its own positions and keys, so its result is the same bits as that sequence's own calls.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "common.h"
#include "block_ops.h"
#include "attention.h"

namespace {

// The AVX-512 path: tasks of a sequence's kv head's query rows in chunks (attend_avx512's, over B sequences);
// false where it does not run (no AVX-512, float64, a head size it has no tile for).
template <typename scalar_t>
bool attend_batch_avx512(const scalar_t* Q, const scalar_t* K, const scalar_t* V, const bool* M, scalar_t* O, int64_t B,
                         int64_t T, int64_t heads, int64_t kv, int64_t d, int64_t cap, int64_t span,
                         const int64_t* lengths) {
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (!tiled_head(d)) return false;
    const int64_t group = heads / kv, rows = T * group, chunk = std::min<int64_t>(kMaxChunk, rows);
    const int64_t chunks = (rows + chunk - 1) / chunk, seq = kv * cap * d;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    at::parallel_for(0, B * kv * chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / (kv * chunks), g = task / chunks % kv, c = task % chunks;
        const int64_t r0 = c * chunk, r1 = std::min(rows, r0 + chunk), o = b * T * heads * d;
        const scalar_t *Kg = K + b * seq + g * cap * d, *Vg = V + b * seq + g * cap * d, *Qb = Q + o;
        const bool* Mb = M + b * T * span;
        const int64_t* lb = lengths + b * T;
        attend_group_tiled<scalar_t>(d, Qb, Kg, Vg, Mb, O + o, heads, group, g, r0, r1, span, lb, scale);
      }
    });
    return true;
  }
#endif
  return false;
}

// y: (B T, (heads + 2 kv) d) fused q|k|v rows, sequence b's T rows at b T; cos, sin: (B T, d); k_cache, v_cache:
// (rows >= B, kv, capacity, d), one layer's; starts: (B,) int64, where sequence b's new rows go; mask: (B, T,
// span) bool, which of its own row's positions each new row sees (span >= starts[b] + T).
// Returns (B T, heads d).
Tensor attend_batch(const Tensor& y, const Tensor& cos, const Tensor& sin, Tensor k_cache, Tensor v_cache,
                    const Tensor& starts, const Tensor& mask, int64_t heads, int64_t kv_heads) {
  check_input(y, "attend_batch: y", y.scalar_type(), 2);
  check_input(cos, "attend_batch: cos", y.scalar_type(), 2);
  check_input(sin, "attend_batch: sin", y.scalar_type(), 2);
  check_input(k_cache, "attend_batch: k_cache", y.scalar_type(), 4);
  check_input(v_cache, "attend_batch: v_cache", y.scalar_type(), 4);
  check_input(starts, "attend_batch: starts", at::kLong, 1);
  check_input(mask, "attend_batch: mask", at::kBool, 3);
  const int64_t B = starts.size(0), N = y.size(0), d = cos.size(1), kv = kv_heads;
  TORCH_CHECK(B >= 1 && N % B == 0, "attend_batch: ", N, " rows for ", B, " sequences");
  TORCH_CHECK(heads > 0 && kv > 0 && heads % kv == 0, "attend_batch: heads ", heads, ", kv heads ", kv);
  const int64_t T = N / B, cap = k_cache.size(2), span = mask.size(2), group = heads / kv;
  TORCH_CHECK(d > 0 && d % 2 == 0 && cos.size(0) == N && sin.sizes() == cos.sizes(), "attend_batch: cos, sin (B T, d)");
  TORCH_CHECK(y.size(1) == (heads + 2 * kv) * d, "attend_batch: qkv width");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(0) >= B && k_cache.size(1) == kv &&
              k_cache.size(3) == d, "attend_batch: caches (rows, kv heads, capacity, d)");
  TORCH_CHECK(mask.size(0) == B && mask.size(1) == T, "attend_batch: mask (B, T, span)");
  const int64_t* at = starts.data_ptr<int64_t>();
  int64_t longest = 1;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(at[b] >= 0 && at[b] + T <= cap && at[b] + T <= span, "attend_batch: sequence ", b, "'s positions ",
                at[b], "..", at[b] + T, " beyond the cache or the mask");
    longest = std::max(longest, at[b] + T);
  }
  // each query row reads keys up to its last attended one of its own sequence's at + T (as attend)
  const bool* M = mask.data_ptr<bool>();
  std::vector<int64_t> lengths(N);
  for (int64_t r = 0; r < N; ++r) {
    int64_t last = at[r / T] + T;
    while (last > 1 && !M[r * span + last - 1]) --last;
    lengths[r] = last;
  }
  Tensor q = at::empty({N, heads, d}, y.options());
  Tensor out = at::empty({N, heads * d}, y.options());
  const int64_t width = (heads + 2 * kv) * d, seq = kv * cap * d;  // a cache row's elements
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "attend_batch", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *Y = y.data_ptr<scalar_t>(), *C = cos.data_ptr<scalar_t>(), *S = sin.data_ptr<scalar_t>();
    scalar_t *Q = q.data_ptr<scalar_t>(), *K = k_cache.data_ptr<scalar_t>(), *V = v_cache.data_ptr<scalar_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, N, std::max<int64_t>(1, kGrain / (16 * width)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        rope_row<scalar_t>(Y + r * width, C + r * d, S + r * d, Q + r * heads * d, K + (r / T) * seq, V + (r / T) * seq,
                           cap, at[r / T] + r % T, heads, kv, d);
    });
    if (attend_batch_avx512<scalar_t>(Q, K, V, M, O, B, T, heads, kv, d, cap, span, lengths.data())) return;
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, longest * d));
    at::parallel_for(0, N * heads, grain, [&](int64_t begin, int64_t end) {
      AttendScratch<acc_t> scratch(longest, d);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t r = task / heads, h = task % heads, b = r / T, g = h / group;
        attend_one<scalar_t>(Q + (r * heads + h) * d, K + b * seq + g * cap * d, V + b * seq + g * cap * d,
                             M + r * span, O + (r * heads + h) * d, lengths[r], d, scale, scratch);
      }
    });
  });
  return out;
}

}  // namespace
