// What the kernels' int8 tiles take from torch, without torch (QUICKDRAFT_NO_TORCH: scripts/arm_check.sh
// cross-builds them for aarch64 and runs them under qemu, where no torch is installed): a serial
// at::parallel_for, at::BFloat16's storage, and c10::Half's exact fp16 -> float conversion.
#pragma once

#include <cstdint>
#include <cstring>

namespace at {
template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t /*grain*/, const F& f) {
  if (begin < end) f(begin, end);
}
struct BFloat16 {
  uint16_t x;
};
}  // namespace at

namespace c10 {
struct Half {
  struct from_bits_t {};
  static constexpr from_bits_t from_bits() { return {}; }
  uint16_t x;
  Half(uint16_t bits, from_bits_t) : x(bits) {}
  operator float() const {  // IEEE binary16 -> binary32, exact (subnormals, infinities, NaNs)
    const uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16, exp = (x >> 10) & 0x1f, man = x & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
      bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
      bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};
}  // namespace c10
