// attend: T query rows over the first L cached positions (GQA, optional mask), with AVX-512 a kv head's
// rows at a time, a scalar loop elsewhere. Python: runtime/forward/llama_block.py (Block._attend).
// Self-contained (it includes what it uses); compiled in fused.cpp's one translation unit.
#pragma once

#include "common.h"

namespace {

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

// A chunk of query rows r0..r1 (row r: query head g * group + r % group of token r / group) over kv head g,
// tiled over blocks of kKeyBlock keys: each block's keys (then values) are read once for all the chunk's rows
// while they sit in L1, where a row at a time streamed the whole cache once per row and head (at a long
// context, from memory). Each row's arithmetic is unchanged: its scores, its max, its exps, then its values
// summed in key order, one key at a time (the running sums leave registers between blocks as the same
// floats), so a row's result is the same bits whatever rows share its chunk.
constexpr int64_t kKeyBlock = 64;
constexpr int64_t kMaxChunk = 32;  // rows a task: their scores are kMaxChunk x keys floats

// Rows j0..j1 of a (keys, d) cache as float32: bf16 widened once a block (exact), float32 read in place.
template <int64_t d>
inline const float* block_as_float(const float* X, int64_t j0, int64_t, std::vector<float>&) { return X + j0 * d; }
template <int64_t d>
inline const float* block_as_float(const at::BFloat16* X, int64_t j0, int64_t j1, std::vector<float>& buf) {
  buf.resize(kKeyBlock * d);
  for (int64_t k = 0; k < (j1 - j0) * d; k += 16) _mm512_storeu_ps(&buf[k], load16f(X + j0 * d + k));
  return buf.data();
}

template <typename scalar_t, int D16>
void attend_group_rows(const scalar_t* Qp, const scalar_t* Kg, const scalar_t* Vg, const bool* M, scalar_t* O,
                       int64_t heads, int64_t group, int64_t g, int64_t r0, int64_t r1, int64_t stride,
                       const int64_t* lengths, float scale) {
  constexpr int64_t d = 16 * D16;
  const int64_t n = r1 - r0;
  int64_t longest = 0;
  for (int64_t r = r0; r < r1; ++r) longest = std::max(longest, lengths[r / group]);  // keys: up to the last attended
  const int64_t width = (longest + 15) / 16 * 16;
  thread_local std::vector<float> p, keep, qs, acc, total, block;
  p.resize(n * width);
  keep.resize(width);
  qs.resize(n * d);
  acc.assign(n * d, 0.f);
  total.assign(n, 0.f);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = (r0 + i) / group, h = g * group + (r0 + i) % group;
    for (int c = 0; c < D16; ++c) _mm512_storeu_ps(&qs[i * d + 16 * c], _mm512_mul_ps(load16f(Qp + (t * heads + h) * d + 16 * c), sc));
  }
  for (int64_t b0 = 0; b0 < longest; b0 += kKeyBlock) {  // scores of 16 keys at a time (a short block: zeros)
    const float* kf = block_as_float<d>(Kg, b0, std::min(b0 + kKeyBlock, longest), block);  // key b0 first
    for (int64_t i = 0; i < n; ++i) {
      const int64_t length = lengths[(r0 + i) / group], b1 = std::min(b0 + kKeyBlock, length);
      __m512 q[D16];
      for (int c = 0; c < D16; ++c) q[c] = _mm512_loadu_ps(&qs[i * d + 16 * c]);
      for (int64_t j0 = b0; j0 < b1; j0 += 16) {
        __m512 part[16];
        for (int jj = 0; jj < 16; ++jj) {
          const int64_t j = j0 + jj;
          if (j >= length) {
            part[jj] = _mm512_setzero_ps();
            continue;
          }
          const float* kr = kf + (j - b0) * d;
          __m512 a = _mm512_mul_ps(q[0], _mm512_loadu_ps(kr));
          for (int c = 1; c < D16; ++c) a = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kr + 16 * c), a);
          part[jj] = a;
        }
        _mm512_storeu_ps(&p[i * width + j0], lane_sums16(part));
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {  // each row's softmax numerators, masked keys exact zeros
    const int64_t t = (r0 + i) / group, length = lengths[t], padded = (length + 15) / 16 * 16;
    float* pr = &p[i * width];
    const bool* mrow = M ? M + t * stride : nullptr;
    for (int64_t j = 0; j < padded; ++j) keep[j] = (j >= length || (mrow && !mrow[j])) ? 0.f : 1.f;
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) best = keep[j] != 0.f ? std::max(best, pr[j]) : best;
    // 16 keys at a time through the vector exp: a key's probability does not depend on how many keys
    // the call holds (a compiler-vectorized loop over `length` would take its tail keys another way)
    const __m512 top = _mm512_set1_ps(best);
    for (int64_t j0 = 0; j0 < padded; j0 += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(pr + j0), top));
      _mm512_storeu_ps(pr + j0, _mm512_mul_ps(e, _mm512_loadu_ps(keep.data() + j0)));
    }
  }
  for (int64_t b0 = 0; b0 < longest; b0 += kKeyBlock) {  // values summed in key order, one key at a time
    const float* vf = block_as_float<d>(Vg, b0, std::min(b0 + kKeyBlock, longest), block);  // value b0 first
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b1 = std::min(b0 + kKeyBlock, lengths[(r0 + i) / group]);
      if (b0 >= b1) continue;
      const float* pr = &p[i * width];
      __m512 a[D16];
      for (int c = 0; c < D16; ++c) a[c] = _mm512_loadu_ps(&acc[i * d + 16 * c]);
      float sum = total[i];
      for (int64_t j = b0; j < b1; ++j) {
        sum += pr[j];
        const __m512 e = _mm512_set1_ps(pr[j]);
        const float* vr = vf + (j - b0) * d;
        for (int c = 0; c < D16; ++c) a[c] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vr + 16 * c), a[c]);
      }
      total[i] = sum;
      for (int c = 0; c < D16; ++c) _mm512_storeu_ps(&acc[i * d + 16 * c], a[c]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = (r0 + i) / group, h = g * group + (r0 + i) % group;
    scalar_t* o = O + t * heads * d + h * d;
    for (int64_t k = 0; k < d; ++k) o[k] = static_cast<scalar_t>(acc[i * d + k] / total[i]);
  }
}

// The head sizes attend_group_rows has a tile for.
inline bool tiled_head(int64_t d) { return d == 64 || d == 128 || d == 256; }

// attend_group_rows at a head size of `d` (tiled_head), its tile picked at run time: attend_avx512's and
// attend_batch's (batch_attention.h).
template <typename scalar_t>
inline void attend_group_tiled(int64_t d, const scalar_t* Qp, const scalar_t* Kg, const scalar_t* Vg, const bool* M,
                               scalar_t* O, int64_t heads, int64_t group, int64_t g, int64_t r0, int64_t r1,
                               int64_t stride, const int64_t* lengths, float scale) {
  if (d == 64) attend_group_rows<scalar_t, 4>(Qp, Kg, Vg, M, O, heads, group, g, r0, r1, stride, lengths, scale);
  else if (d == 128) attend_group_rows<scalar_t, 8>(Qp, Kg, Vg, M, O, heads, group, g, r0, r1, stride, lengths, scale);
  else attend_group_rows<scalar_t, 16>(Qp, Kg, Vg, M, O, heads, group, g, r0, r1, stride, lengths, scale);
}

template <typename scalar_t>
bool attend_avx512(const scalar_t* Qp, const scalar_t* Kp, const scalar_t* Vp, const bool* M, scalar_t* O, int64_t T,
                   int64_t heads, int64_t kv, int64_t d, int64_t cap, int64_t stride, const int64_t* lengths) {
  if (!tiled_head(d)) return false;
  // tasks: a kv head's rows (row x head of its group) in chunks, about two tasks a thread, at most kMaxChunk
  // rows each (a chunk reads its keys and values once, so the wider the fewer passes over the cache)
  const int64_t group = heads / kv, rows = T * group, tasks = 2 * std::max<int64_t>(1, at::get_num_threads());
  const int64_t chunk = std::min<int64_t>(kMaxChunk, std::max<int64_t>(1, (rows * kv + tasks - 1) / tasks));
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  at::parallel_for(0, kv * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      // chunks taken first, last, second, second last...: under a causal mask late rows read more keys,
      // and each thread's contiguous range of tasks gets early and late rows alike
      const int64_t g = task % kv, j = task / kv, c = j % 2 == 0 ? j / 2 : chunks - 1 - j / 2;
      const int64_t r0 = c * chunk, r1 = std::min(rows, r0 + chunk);
      const scalar_t* Kg = Kp + g * cap * d;
      const scalar_t* Vg = Vp + g * cap * d;
      attend_group_tiled<scalar_t>(d, Qp, Kg, Vg, M, O, heads, group, g, r0, r1, stride, lengths, scale);
    }
  });
  return true;
}
#endif

// ---- the generic path, one (query row, head) at a time ---------------------------------------------------
template <typename acc_t>
struct AttendScratch {  // a thread's buffers, for rows of up to `keys` keys
  std::vector<acc_t> p, keep, qf, acc;
  AttendScratch(int64_t keys, int64_t d) : p((keys + 7) / 8 * 8), keep((keys + 7) / 8 * 8), qf(d), acc(d) {}
};

// One query row qr (d) of one head over the first `length` keys and values kb, vb ((length, d) rows of its kv
// head), under mrow (length bools; nullptr: all seen) -> o (d). attend's and attend_batch's (batch_attention.h).
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
void attend_one(const scalar_t* qr, const scalar_t* kb, const scalar_t* vb, const bool* mrow, scalar_t* o,
                int64_t length, int64_t d, double scale, AttendScratch<acc_t>& w) {
  const int64_t padded8 = (length + 7) / 8 * 8;
  for (int64_t i = 0; i < d; ++i) w.qf[i] = static_cast<acc_t>(qr[i]) * static_cast<acc_t>(scale);
  for (int64_t j = 0; j < length; ++j) {
    const scalar_t* kr = kb + j * d;
    acc_t s = 0;
    for (int64_t i = 0; i < d; ++i) s += w.qf[i] * static_cast<acc_t>(kr[i]);
    w.p[j] = s;
    w.keep[j] = (mrow && !mrow[j]) ? acc_t(0) : acc_t(1);
  }
  acc_t best = -std::numeric_limits<acc_t>::infinity();
  for (int64_t j = 0; j < length; ++j) best = w.keep[j] != 0 ? std::max(best, w.p[j]) : best;
  // in fixed blocks of 8 keys (padded with masked ones): every key goes through the same code
  // whatever `length` is (a vectorized loop over `length` takes its tail keys another way)
  for (int64_t j0 = 0; j0 < padded8; j0 += 8)
    for (int jj = 0; jj < 8; ++jj) w.p[j0 + jj] = fast_exp(w.p[j0 + jj] - best) * w.keep[j0 + jj];  // masked: 0
  // Sums in key order, one key at a time (the vectorized loop runs over the head dimension): a row's
  // result does not depend on how many keys or other rows the call holds (masked keys add zeros),
  // so a row verified among others equals the same row decoded alone, bit for bit.
  acc_t total = 0;
  std::fill(w.acc.begin(), w.acc.end(), acc_t(0));
  for (int64_t j = 0; j < length; ++j) {
    const scalar_t* vr = vb + j * d;
    const acc_t e = w.p[j];
    total += e;
    for (int64_t i = 0; i < d; ++i) w.acc[i] += e * static_cast<acc_t>(vr[i]);
  }
  for (int64_t i = 0; i < d; ++i) o[i] = static_cast<scalar_t>(w.acc[i] / total);
}

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
  // a bool mask only: an additive float mask (0 / -inf, SDPA's other form) would read inverted as bools
  TORCH_CHECK(!masked || mask->scalar_type() == at::kBool, "attend: mask must be bool (true: attended)");
  Tensor m = masked ? mask->contiguous() : Tensor();
  TORCH_CHECK(!masked || (m.dim() == 2 && m.size(0) == T && m.size(1) == length), "attend: mask must be (T, length)");
  Tensor out = at::empty({T, heads * d}, q.options());
  const int64_t group = heads / kv;
  // each row reads keys up to its last attended one (a causal prefill: half the work); the keys it skips
  // are masked, whose probabilities are exact zeros, so its result is the same bits as over all of them
  std::vector<int64_t> lengths(T, length);
  if (masked) {
    const bool* mp = m.data_ptr<bool>();
    for (int64_t t = 0; t < T; ++t) {
      int64_t last = length;
      while (last > 1 && !mp[t * length + last - 1]) --last;
      lengths[t] = last;
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "attend", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* Qp = q.data_ptr<scalar_t>();
    const scalar_t* Kp = k_cache.data_ptr<scalar_t>();
    const scalar_t* Vp = v_cache.data_ptr<scalar_t>();
    const bool* M = masked ? m.data_ptr<bool>() : nullptr;
    scalar_t* O = out.data_ptr<scalar_t>();
    const int64_t stride = length;  // a mask row's elements
#if defined(__AVX512F__)
    if constexpr (!std::is_same_v<scalar_t, double>) {
      if (attend_avx512<scalar_t>(Qp, Kp, Vp, M, O, T, heads, kv, d, cap, stride, lengths.data())) return;
    }
#endif
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, length * d));
    at::parallel_for(0, T * heads, grain, [&](int64_t begin, int64_t end) {
      AttendScratch<acc_t> scratch(length, d);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / heads, h = task % heads, g = h / group;
        attend_one<scalar_t>(Qp + (t * heads + h) * d, Kp + g * cap * d, Vp + g * cap * d, M ? M + t * stride : nullptr,
                             O + (t * heads + h) * d, lengths[t], d, scale, scratch);
      }
    });
  });
  return out;
}

}  // namespace
