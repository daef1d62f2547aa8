// Fused CPU kernels for the native block (runtime/kernels/__init__.py builds and loads them), one
// translation unit of self-contained parts (common.h: the shared ground), each named as the Python file that calls it:
//   block_ops.h     add_rms_norm, rope_store, silu_mul, gelu_tanh_mul       (runtime/forward/llama_block.py)
//   attention.h     attend                                                  (runtime/forward/llama_block.py)
//   batch_attention.h  attend_batch: RoPE, cache writes, attention of a batch  (runtime/kernels/batch_attention.py)
//   linear.h        pack_bf16, linear_packed                                (runtime/kernels/linear.py)
//   int8_dots.h     the int8 tiles' shared ground: stores, row dispatch, each level's dot products
//   int8_rows.h     the int8-activation linears' rows: their quantization
//   w8a8.h          pack_int8, pack_blocks, linear_w8a8, linear_w8a8_min    (runtime/quant/w8a8.py)
//   w4a8.h          pack_q4, linear_w4a8                                    (runtime/quant/w4a8.py)
//   w6a8.h          pack_q6, linear_w6a8                                    (runtime/quant/w6a8.py)
//   q4k.h           pack_q4k, linear_q4k                                    (runtime/quant/q4k.py)
//   fused_layers.h  llama_layers: the kernels above over a run of layers    (runtime/kernels/fused_layers.py)
//
// A one-row step of a small model is dominated by per-op overhead, not arithmetic: torch.profiler on
// SmolLM2-135M showed flash SDPA at 142 us a call for one query row over 200 keys, and RMSNorm's six
// ops at 30 us (scripts/step_profile.py). These kernels do each of those as one call, row by row,
// with the arithmetic of the torch path they replace (float32 accumulation for bf16 and float32,
// float64 for float64). Built once per instruction-set level (x86-64: avx512_bf16, avx512_vnni, avx512,
// avx_vnni, avx2, scalar; Arm: i8mm, dotprod, neon: the level's -march/-m flags); the vector paths follow
// the level's macros (__AVX512F__, __AVX512VNNI__, __AVX512BF16__, __AVX2__ with __AVXVNNI__ for the
// linears' 256-bit paths where AVX-512's are not built; __ARM_FEATURE_DOTPROD, __ARM_FEATURE_MATMUL_INT8),
// the rest is the compiler's vectorization.
// Every tensor a kernel indexes is checked first (check_input, TORCH_CHECK): a clear error, never a
// read out of bounds.
#include "block_ops.h"
#include "attention.h"
#include "batch_attention.h"
#include "linear.h"
#include "int8_rows.h"
#include "w8a8.h"
#include "w4a8.h"
#include "w6a8.h"
#include "q4k.h"
#include "fused_layers.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // every kernel runs without the GIL (its arguments converted first): a long prefill on the server's
  // decode thread never starves the event loop (/health, /metrics, new requests; issue #71)
  const auto kFree = py::call_guard<py::gil_scoped_release>();
  m.def("add_rms_norm", &add_rms_norm, kFree, "optional residual add, then RMSNorm (HF's arithmetic)");
  m.def("rope_store", &rope_store, kFree, "RoPE on q and k of fused qkv rows; k, v written to the layer's cache");
  m.def("attend", &attend, kFree, "attention of T rows over the first L cached positions (GQA, optional mask)");
  m.def("attend_batch", &attend_batch, kFree, "rope_store and attend for each sequence of a batch, over its own cache row");
  m.def("silu_mul", &silu_mul, kFree, "silu(gate) * up over fused gate|up rows");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, kFree, "gelu_tanh(gate) * up over fused gate|up rows (GeGLU)");
  m.def("pack_bf16", &pack_bf16, kFree, "a (N, K) bf16 weight in linear_packed's layout (N/16, K/2, 16, 2)");
  m.def("linear_packed", &linear_packed, kFree, "x W^T for bf16 rows over a pack_bf16 weight (AVX512-BF16 where present)");
  m.def("pack_int8", &pack_int8, kFree, "(N, K) int8 weights in linear_w8a8's layout (N/16, K/4, 16, 4), K padded to 32");
  m.def("pack_blocks", &pack_blocks, kFree, "(N, K/32) per-block scales in linear_w8a8's layout (N/16, K/32, 16)");
  m.def("linear_w8a8", &linear_w8a8, kFree, "x W^T with int8 weights and per-row int8 activations (VNNI where present)");
  m.def("linear_w8a8_min", &linear_w8a8_min, kFree, "linear_w8a8 with a float min per output and 16 inputs (w = s q + mn), after the scales");
  m.def("pack_q4", &pack_q4, kFree, "(N, K) 4-bit codes with (N, K/32) scales and mins in linear_w4a8's layout (N/16, K/32, 320)");
  m.def("linear_w4a8", &linear_w4a8, kFree, "x W^T with 4-bit weights (q d + m) and per-row int8 activations (VNNI)");
  m.def("pack_q6", &pack_q6, kFree, "(N, K) 6-bit codes, (N, K/16) int8 scales, (N, K/256) d in linear_w6a8's layout (N/16, K/32, 448)");
  m.def("pack_q6_gguf", &pack_q6_gguf, kFree, "a GGUF Q6_K tensor's raw rows (N, K/256 x 210) in linear_w6a8's layout");
  m.def("linear_w6a8", &linear_w6a8, kFree, "x W^T with Q6_K weights (d sc (q - 32)) and per-row int8 activations (VNNI)");
  m.def("pack_q4k", &pack_q4k, kFree, "(N, K) 4-bit codes, (N, K/32) 6-bit sc and mn, (N, K/256) d and dmin in linear_q4k's layout");
  m.def("pack_q4k_gguf", &pack_q4k_gguf, kFree, "a GGUF Q4_K tensor's raw rows (N, K/256 x 144) in linear_q4k's layout");
  m.def("linear_q4k", &linear_q4k, kFree, "x W^T with Q4_K weights (d sc q - dmin mn) and per-row int8 activations (VNNI)");
  m.def("llama_layers", &llama_layers, kFree, "plain Llama blocks over one sequence's rows, one call (the kernels above)");
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
