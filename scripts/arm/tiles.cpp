// One instruction-set level's int8 tiles, built without torch (QUICKDRAFT_NO_TORCH) from the kernels'
// own headers with the level's own flags, and named by it: quickdraft_tiles_<LEVEL>() returns the runs
// scripts/arm/check.cpp compares with the scalar level's. With QUICKDRAFT_CONTROL, the negative control:
// the same tiles with one wrong lane in each dot product (sdot's quad 3 reads quad 2; smmla's last weight
// byte reads 0), which the check must find.
#include "api.h"

#if defined(QUICKDRAFT_CONTROL)
#include <arm_neon.h>
#define vdotq_laneq_s32(acc, a, b, lane) (vdotq_laneq_s32)(acc, a, b, (lane) == 3 ? 2 : (lane))
#define vmmlaq_s32(acc, a, b) (vmmlaq_s32)(acc, a, vsetq_lane_s8(0, b, 15))
#endif

#include "q4k.h"
#include "w6a8.h"

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

namespace {

void quantize(const float* X, int64_t M, int64_t K, int64_t Kp, int64_t KB, int8_t* xq, float* sx, int32_t* xc, int32_t* xh) {
  quantize_rows(X, M, K, Kp, KB, xq, sx, xc, xh);
}
void w8a8(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* WS, const float* SX,
          const int32_t* XC, const int32_t* XH, float* Y, int64_t NBk, bool mins) {
  if (mins) w8a8_run<true>(X, M, xs, KB, W, WS, SX, XC, XH, Y, NBk);
  else w8a8_run<false>(X, M, xs, KB, W, WS, SX, XC, XH, Y, NBk);
}
void w4a8(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* SX, const float* SXQ,
          float* Y, int64_t NBk) {
  w4a8_run<float>(X, M, xs, KB, W, SX, SXQ, Y, NBk);
}
void w6a8(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* SX, const int32_t* H16,
          float* Y, int64_t NBk) {
  w6a8_run<float>(X, M, xs, KB, W, SX, H16, Y, NBk);
}
void q4k(const int8_t* X, int64_t M, int64_t xs, int64_t KS, const uint8_t* W, const float* SX, const float* SXQ,
         float* Y, int64_t NBk) {
  q4k_run<float>(X, M, xs, KS, W, SX, SXQ, Y, NBk);
}

}  // namespace

extern "C" const Tiles* CAT(quickdraft_tiles_, LEVEL)() {
  static const Tiles tiles{quantize, w8a8, w4a8, w6a8, q4k};
  return &tiles;
}
