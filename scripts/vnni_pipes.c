// How many 512-bit byte dot products (vpdpbusd) a core retires per cycle, alone and beside the float work of a
// 4-bit product's group epilogue (int-to-float conversions, multiplies, multiply-adds): whether they share
// execution pipes decides how much of the VNNI peak `FourBitPanels::pair` can reach. docs/native_runtime.md
// (stop 50) quotes it. AVX-512 VNNI CPUs only:
//
//     gcc -O2 -mavx512f -mavx512vnni scripts/vnni_pipes.c -o /tmp/vnni_pipes && /tmp/vnni_pipes
//
// The clock is estimated from a chain of dependent integer adds (one a cycle), so "per cycle" is per cycle of the
// clock that chain ran at.
#include <stdio.h>
#include <time.h>

static double seconds_since(const struct timespec* start) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) * 1e-9;
}

#define DOTS8                                                                                                  \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm0\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm1\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm2\n\t" \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm3\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm4\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm5\n\t" \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm6\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm7\n\t"
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", "xmm11", "xmm12", "xmm13"
// Cycles of one pass of the instructions ASM, over n passes (a statement expression: start, n and ghz in scope).
#define CYCLES_PER_PASS(ASM)                                              \
  ({                                                                      \
    clock_gettime(CLOCK_MONOTONIC, &start);                               \
    for (long i = 0; i < n; ++i) __asm__ volatile(ASM ::: CLOBBERS);      \
    seconds_since(&start) * ghz * 1e9 / n;                                \
  })

int main(void) {
  const long n = 100000000;
  struct timespec start;
  long x = 0;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (long i = 0; i < n; ++i) __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(x));
  const double ghz = 4.0 * n / seconds_since(&start) / 1e9;
  printf("clock: %.2f GHz (dependent integer adds)\n", ghz);

  printf("8 independent vpdpbusd: %.2f cycles (one pipe: 8, two: 4)\n", CYCLES_PER_PASS(DOTS8));
  printf("8 vpdpbusd + 4 vfmadd231ps: %.2f cycles (the same two pipes: 6; pipes of their own: 4)\n",
         CYCLES_PER_PASS(DOTS8 "vfmadd231ps %%zmm28,%%zmm29,%%zmm10\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm11\n\t"
                                "vfmadd231ps %%zmm28,%%zmm29,%%zmm12\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm13\n\t"));
  printf("8 vpdpbusd + one row's group epilogue (vcvtdq2ps, vmulps, 2 vfmadd231ps): %.2f cycles\n",
         CYCLES_PER_PASS(DOTS8 "vcvtdq2ps %%zmm28,%%zmm10\n\tvmulps %%zmm28,%%zmm29,%%zmm11\n\t"
                                "vfmadd231ps %%zmm28,%%zmm29,%%zmm12\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm13\n\t"));
  return (int)(x & 1);
}
