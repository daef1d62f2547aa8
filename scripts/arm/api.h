// The int8 tiles' runs as scripts/arm/check.cpp calls them, one table per level (scripts/arm/tiles.cpp):
// each the kernels' own `*_run` (every tile height a width needs) over float outputs.
#pragma once

#include <cstdint>

struct Tiles {
  void (*quantize)(const float* X, int64_t M, int64_t K, int64_t Kp, int64_t KB, int8_t* xq, float* sx, int32_t* xc,
                   int32_t* xh);
  void (*w8a8)(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* WS, const float* SX,
               const int32_t* XC, const int32_t* XH, float* Y, int64_t NBk, bool mins);
  void (*w4a8)(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* SX, const float* SXQ,
               float* Y, int64_t NBk);
  void (*w6a8)(const int8_t* X, int64_t M, int64_t xs, int64_t KB, const uint8_t* W, const float* SX,
               const int32_t* H16, float* Y, int64_t NBk);
  void (*q4k)(const int8_t* X, int64_t M, int64_t xs, int64_t KS, const uint8_t* W, const float* SX, const float* SXQ,
              float* Y, int64_t NBk);
};
