// The int8 tiles' exactness on Arm (issue #78): every tile (w8a8, w8a8 with mins, w4a8, w6a8, Q4_K) and the
// rows' quantization, at every width 1-33 (each tile height and remainder), at levels dotprod and i8mm,
// each against the scalar level's bits; then the control (i8mm with one wrong lane) must differ in every
// tile. Built by scripts/arm_check.sh, run under qemu-aarch64 -cpu max; ends with "N passed, N failed".
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "api.h"

extern "C" const Tiles* quickdraft_tiles_scalar();
extern "C" const Tiles* quickdraft_tiles_dotprod();
extern "C" const Tiles* quickdraft_tiles_i8mm();
extern "C" const Tiles* quickdraft_tiles_control();

namespace {

constexpr int64_t K = 512, KB = K / 32, KS = K / 256, NBk = 3, N = NBk * 16, kMaxRows = 33;

struct Rng {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint32_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return static_cast<uint32_t>(s >> 11);
  }
  float uniform() { return static_cast<float>(next() & 0xFFFFFF) / 16777216.f * 2.f - 1.f; }
  uint16_t half() { return static_cast<uint16_t>(((next() & 1) << 15) | ((8 + next() % 9) << 10) | (next() & 0x3FF)); }
};

void put_half(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

struct Rows {  // kMaxRows rows of K activations, quantized by a level
  std::vector<int8_t> xq = std::vector<int8_t>(kMaxRows * K);
  std::vector<float> sx = std::vector<float>(kMaxRows * KB), sxq = std::vector<float>(kMaxRows * KB);
  std::vector<int32_t> xc = std::vector<int32_t>(kMaxRows * KB), xh = std::vector<int32_t>(2 * kMaxRows * KB),
                       h16 = std::vector<int32_t>(2 * kMaxRows * KB);
};

Rows quantized(const Tiles* t, const std::vector<float>& x) {
  Rows r;
  t->quantize(x.data(), kMaxRows, K, K, KB, r.xq.data(), r.sx.data(), r.xc.data(), r.xh.data());
  for (int64_t i = 0; i < kMaxRows * KB; ++i) r.sxq[i] = r.sx[i] * static_cast<float>(r.xc[i] / 128);
  for (int64_t i = 0; i < 2 * kMaxRows * KB; ++i) {
    int32_t s = 0;
    for (int k = 0; k < 16; ++k) s += r.xq[16 * i + k];
    r.h16[i] = s;
  }
  return r;
}

struct Weights {
  std::vector<uint8_t> w8 = std::vector<uint8_t>(NBk * K * 16), q4 = std::vector<uint8_t>(NBk * KB * 320),
                       q6 = std::vector<uint8_t>(NBk * KB * 448), q4k = std::vector<uint8_t>(NBk * KS * 2368);
  std::vector<float> ws = std::vector<float>(NBk * 3 * KB * 16);
};

Weights random_weights(Rng& rng) {  // any codes, finite fp16 scales where the layouts keep them
  Weights w;
  for (auto* v : {&w.w8, &w.q4, &w.q6, &w.q4k})
    for (auto& b : *v) b = static_cast<uint8_t>(rng.next());
  for (auto& f : w.ws) f = 0.02f * rng.uniform();
  for (int64_t blk = 0; blk < NBk * KB; ++blk) {
    for (int o = 0; o < 32; ++o) put_half(&w.q4[blk * 320 + 256 + 2 * o], rng.half());
    for (int o = 0; o < 16; ++o) put_half(&w.q6[blk * 448 + 416 + 2 * o], rng.half());
  }
  for (int64_t sup = 0; sup < NBk * KS; ++sup) {
    uint8_t* p = &w.q4k[sup * 2368];
    for (int o = 0; o < 32; ++o) put_half(p + 2 * o, rng.half());
    for (int i = 64; i < 64 + 256; ++i) p[i] &= 0x3F;  // 6-bit sc and mn
  }
  return w;
}

std::vector<float> run(const Tiles* t, const char* tile, const Rows& r, const Weights& w, int64_t M) {
  std::vector<float> y(M * N);
  const std::string name = tile;
  if (name == "w8a8" || name == "w8a8_min")
    t->w8a8(r.xq.data(), M, K, KB, w.w8.data(), w.ws.data(), r.sx.data(), r.xc.data(), r.xh.data(), y.data(), NBk,
            name == "w8a8_min");
  if (name == "w4a8") t->w4a8(r.xq.data(), M, K, KB, w.q4.data(), r.sx.data(), r.sxq.data(), y.data(), NBk);
  if (name == "w6a8") t->w6a8(r.xq.data(), M, K, KB, w.q6.data(), r.sx.data(), r.h16.data(), y.data(), NBk);
  if (name == "q4k") t->q4k(r.xq.data(), M, K, KS, w.q4k.data(), r.sx.data(), r.sxq.data(), y.data(), NBk);
  return y;
}

bool same_bits(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

}  // namespace

int main() {
  Rng rng;
  std::vector<float> x(kMaxRows * K);
  for (int64_t i = 0; i < kMaxRows * K; ++i) x[i] = rng.uniform() * (i % 97 == 0 ? 40.f : 1.f);
  for (int k = 0; k < 32; ++k) x[5 * K + 64 + k] = 0.f;  // an all-zero block: scale 0
  const Weights w = random_weights(rng);
  const Tiles* ref = quickdraft_tiles_scalar();
  const Rows rows = quantized(ref, x);
  const char* tiles[] = {"w8a8", "w8a8_min", "w4a8", "w6a8", "q4k"};
  int passed = 0, failed = 0;
  const std::pair<const char*, const Tiles*> levels[] = {{"dotprod", quickdraft_tiles_dotprod()},
                                                         {"i8mm", quickdraft_tiles_i8mm()}};
  for (const auto& [level, t] : levels) {
    const Rows mine = quantized(t, x);  // the rows' quantization (the prefill's first step) at this level
    const bool q_ok = same_bits(mine.xq.data(), rows.xq.data(), rows.xq.size()) &&
                      same_bits(mine.sx.data(), rows.sx.data(), rows.sx.size() * 4) &&
                      same_bits(mine.xc.data(), rows.xc.data(), rows.xc.size() * 4) &&
                      same_bits(mine.xh.data(), rows.xh.data(), rows.xh.size() * 4);
    std::printf("%-8s quantize  %s\n", level, q_ok ? "equal" : "DIFFERS");
    (q_ok ? passed : failed) += 1;
    for (const char* tile : tiles) {
      int equal = 0;
      std::string bad;
      for (int64_t M = 1; M <= kMaxRows; ++M) {
        const std::vector<float> a = run(t, tile, rows, w, M), b = run(ref, tile, rows, w, M);
        if (same_bits(a.data(), b.data(), a.size() * 4)) {
          ++equal, ++passed;
        } else {
          ++failed, bad += " " + std::to_string(M);
        }
      }
      std::printf("%-8s %-9s %d/%d widths equal to scalar%s%s\n", level, tile, equal, static_cast<int>(kMaxRows),
                  bad.empty() ? "" : "; differ at", bad.c_str());
    }
  }
  for (const char* tile : tiles) {  // the control must fail: one wrong lane changes some width's bits
    int differ = 0;
    for (int64_t M = 1; M <= kMaxRows; ++M) {
      const std::vector<float> a = run(quickdraft_tiles_control(), tile, rows, w, M), b = run(ref, tile, rows, w, M);
      differ += !same_bits(a.data(), b.data(), a.size() * 4);
    }
    std::printf("control  %-9s %d/%d widths differ (a wrong lane must be found)\n", tile, differ, static_cast<int>(kMaxRows));
    (differ > 0 ? passed : failed) += 1;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
