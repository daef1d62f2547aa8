// llama_layers: plain Llama (and Qwen2: q/k/v biases) blocks over one sequence's rows in one call, the kernels above in the order
// Block._fused_forward calls them. Python: runtime/kernels/fused_layers.py.
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "block_ops.h"
#include "attention.h"
#include "linear.h"
#include "w8a8.h"
#include "w4a8.h"
#include "w6a8.h"
#include "q4k.h"

namespace {

// ---- plain Llama blocks, one call for a run of layers ------------------------------------------------------
// What llama_block.Block._fused_forward does layer by layer from Python, without Python between the
// kernels (measured: a real share of a small model's w4a8 step was Python and small torch ops;
// docs/benchmarks.md). The same kernels in the same order, so the same bits. A linear is (kind, a, b, out):
// kind 0 = linear_packed(a), 1 = linear_w8a8(a, scales b), 2 = linear_w4a8(a), 3 = linear_w6a8(a), 4 = linear_q4k(a),
// 5 = linear_w8a8_min(a, scales and mins b).
Tensor run_linear(const Tensor& x, int64_t kind, const Tensor& a, const Tensor& b, int64_t out) {
  switch (kind) {
    case 0: return linear_packed(x, a, out);
    case 1: return linear_w8a8(x, a, b, out);
    case 2: return linear_w4a8(x, a, out);
    case 3: return linear_w6a8(x, a, out);
    case 4: return linear_q4k(x, a, out);
    case 5: return linear_w8a8_min(x, a, b, out);
    default: TORCH_CHECK(false, "llama_layers: unknown linear kind ", kind);
  }
}

// x (T, H); per layer l of [first, first + count): norms[2l], norms[2l + 1] (attention, MLP), qkv_parts[l]
// linears whose outputs side by side are the q|k|v rows (1: one fused linear; 2 or 3 where the parts'
// kinds differ, e.g. a Q4_K_M file's Q6_K v beside Q4_K q and k), then o, gate|up fused and down, and
// biases[l], added to the q|k|v rows (Qwen2; an empty tensor: none); k_all, v_all (layers, kv, capacity, d);
// rows written at `at`, RoPE tables cos, sin (T, d), mask (T, at + T) or none -> x after the layers.
Tensor llama_layers(Tensor x, const std::vector<Tensor>& norms, const std::vector<int64_t>& kinds,
                    const std::vector<Tensor>& wa, const std::vector<Tensor>& wb, const std::vector<int64_t>& outs,
                    const std::vector<int64_t>& qkv_parts, const std::vector<Tensor>& biases, const Tensor& k_all, const Tensor& v_all, int64_t first, int64_t at, const Tensor& cos,
                    const Tensor& sin, const c10::optional<Tensor>& mask, int64_t heads, int64_t kv_heads, double eps) {
  const int64_t count = static_cast<int64_t>(norms.size()) / 2, T = x.size(0);
  int64_t linears = 0;
  for (const int64_t n : qkv_parts) {
    TORCH_CHECK(n >= 1 && n <= 3, "llama_layers: 1 to 3 q|k|v linears a layer, not ", n);
    linears += n + 3;
  }
  TORCH_CHECK(static_cast<int64_t>(kinds.size()) == linears && wa.size() == kinds.size() && wb.size() == kinds.size() &&
              outs.size() == kinds.size() && 2 * biases.size() == norms.size() && 2 * qkv_parts.size() == norms.size(),
              "llama_layers: q|k|v parts and three more linears, two norms and a bias a layer");
  for (const Tensor* t : {&k_all, &v_all})  // each layer's (kv, capacity, d) contiguous: a batch cache's row is a view
    TORCH_CHECK(t->defined() && t->device().is_cpu() && t->scalar_type() == k_all.scalar_type() && t->dim() == 4 &&
                    t->select(0, 0).is_contiguous(),
                "llama_layers: caches (layers, kv heads, capacity, d), each layer contiguous, got ", t->sizes());
  TORCH_CHECK(k_all.sizes() == v_all.sizes() && first >= 0 && first + count <= k_all.size(0),
              "llama_layers: layers ", first, "..", first + count, " beyond the cache's ", k_all.size(0));
  x = x.contiguous();
  const c10::optional<Tensor> none;
  int64_t i = 0;  // the layer's first linear
  for (int64_t l = 0; l < count; ++l) {
    const Tensor kc = k_all.select(0, first + l), vc = v_all.select(0, first + l);
    const Tensor h = add_rms_norm(x, none, norms[2 * l], eps)[1];
    Tensor y;
    if (qkv_parts[l] == 1) {
      y = run_linear(h, kinds[i], wa[i], wb[i], outs[i]);
    } else {  // as the Python path's torch.cat of the parts' outputs
      std::vector<Tensor> parts;
      for (int64_t p = 0; p < qkv_parts[l]; ++p) parts.push_back(run_linear(h, kinds[i + p], wa[i + p], wb[i + p], outs[i + p]));
      y = at::cat(parts, 1);
    }
    i += qkv_parts[l] - 1;  // from here on i + 1, i + 2, i + 3 are o, gate|up, down
    if (biases[l].numel() > 0) y = at::add(y, biases[l]);  // as the Python path's y + bias: the same bits
    const Tensor q = rope_store(y, cos, sin, kc, vc, at, heads, kv_heads);
    const Tensor o = attend(q, kc, vc, at + T, mask);
    const std::vector<Tensor> r = add_rms_norm(x, run_linear(o, kinds[i + 1], wa[i + 1], wb[i + 1], outs[i + 1]),
                                               norms[2 * l + 1], eps);
    const Tensor m = silu_mul(run_linear(r[1], kinds[i + 2], wa[i + 2], wb[i + 2], outs[i + 2]));
    x = at::add(r[0], run_linear(m, kinds[i + 3], wa[i + 3], wb[i + 3], outs[i + 3]));
    i += 4;
  }
  return x;
}

}  // namespace
