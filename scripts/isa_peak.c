// The integer dot-product instructions' throughput on this core: ten independent chains of one
// instruction, so latency hides and only the pipes count. What an int8 linear's tile can reach at best:
// vpmaddubsw does 32 multiply-adds (u8 x s8 into int16 pairs).
//     gcc -O2 -mavx2 scripts/isa_peak.c -o /tmp/isa_peak && /tmp/isa_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define STEP(OP) a0 = OP(b, a0); a1 = OP(b, a1); a2 = OP(b, a2); a3 = OP(b, a3); a4 = OP(b, a4); \
  a5 = OP(b, a5); a6 = OP(b, a6); a7 = OP(b, a7); a8 = OP(b, a8); a9 = OP(b, a9);
#define RUN(NAME, OP)                                                                                       \
  {                                                                                                         \
    __m256i a0 = _mm256_set1_epi16(1), a1 = _mm256_set1_epi16(2), a2 = _mm256_set1_epi16(3),                \
            a3 = _mm256_set1_epi16(4), a4 = _mm256_set1_epi16(5), a5 = _mm256_set1_epi16(6),                \
            a6 = _mm256_set1_epi16(7), a7 = _mm256_set1_epi16(8), a8 = _mm256_set1_epi16(9),                \
            a9 = _mm256_set1_epi16(10);                                                                     \
    double t = now();                                                                                       \
    for (long n = 0; n < N; n++) {                                                                          \
      STEP(OP)                                                                                              \
      __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), \
                       "+x"(a8), "+x"(a9));                                                                 \
    }                                                                                                       \
    double dt = now() - t;                                                                                  \
    a0 = _mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a9));                              \
    printf("%-11s %.3f ns an instruction, %.2f G/s (check %d)\n", NAME, dt / (N * 10) * 1e9,                \
           N * 10 / dt / 1e9, _mm256_extract_epi16(a0, 0));                                                 \
  }

int main(void) {
  const __m256i b = _mm256_set1_epi8(3);
  const long N = 100000000;
  RUN("vpmaddubsw", _mm256_maddubs_epi16)
  RUN("vpmaddwd", _mm256_madd_epi16)
  RUN("vpaddw", _mm256_add_epi16)
  RUN("vpand", _mm256_and_si256)
  return 0;
}
