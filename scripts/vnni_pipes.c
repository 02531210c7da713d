// How many 512-bit byte dot products (vpdpbusd) a core retires per cycle, alone and beside the float work of a
// 4-bit product's group epilogue (int-to-float conversions, multiplies, multiply-adds): whether they share
// execution pipes decides how much of the VNNI peak `FourBitPanels::pair` can reach. 16 independent sums, so that
// a latency of up to 8 cycles still leaves two pipes busy (8 were too few on an Intel Xeon, stop 62).
// docs/native_runtime.md (stops 50 and 62) quotes it. AVX-512 VNNI CPUs only:
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

#define DOTS16                                                                                                  \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm0\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm1\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm2\n\t"  \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm3\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm4\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm5\n\t"  \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm6\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm7\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm8\n\t"  \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm9\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm10\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm11\n\t" \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm12\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm13\n\tvpdpbusd %%zmm30,%%zmm31,%%zmm14\n\t" \
  "vpdpbusd %%zmm30,%%zmm31,%%zmm15\n\t"
#define CLOBBERS                                                                                          \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"
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
  long x = 0, one = 1;
  clock_gettime(CLOCK_MONOTONIC, &start);
  // A register operand, not an immediate: Intel's Golden Cove cores (Sapphire Rapids) fold chains of adds of an
  // immediate when renaming them, which made this chain read 13 GHz there (stop 62).
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("add %1,%0\n\tadd %1,%0\n\tadd %1,%0\n\tadd %1,%0" : "+r"(x) : "r"(one));
  }
  const double ghz = 4.0 * n / seconds_since(&start) / 1e9;
  printf("clock: %.2f GHz (dependent integer adds)\n", ghz);

  printf("16 independent vpdpbusd: %.2f cycles (one pipe: 16, two: 8)\n", CYCLES_PER_PASS(DOTS16));
  printf("16 vpdpbusd + 8 vfmadd231ps: %.2f cycles (the same two pipes: 12; pipes of their own: 8)\n",
         CYCLES_PER_PASS(DOTS16 "vfmadd231ps %%zmm28,%%zmm29,%%zmm16\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm17\n\t"
                                 "vfmadd231ps %%zmm28,%%zmm29,%%zmm18\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm19\n\t"
                                 "vfmadd231ps %%zmm28,%%zmm29,%%zmm20\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm21\n\t"
                                 "vfmadd231ps %%zmm28,%%zmm29,%%zmm22\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm23\n\t"));
  printf("16 vpdpbusd + two rows' group epilogues (vcvtdq2ps, vmulps, 2 vfmadd231ps each): %.2f cycles\n",
         CYCLES_PER_PASS(DOTS16 "vcvtdq2ps %%zmm28,%%zmm16\n\tvmulps %%zmm28,%%zmm29,%%zmm17\n\t"
                                 "vfmadd231ps %%zmm28,%%zmm29,%%zmm18\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm19\n\t"
                                 "vcvtdq2ps %%zmm28,%%zmm20\n\tvmulps %%zmm28,%%zmm29,%%zmm21\n\t"
                                 "vfmadd231ps %%zmm28,%%zmm29,%%zmm22\n\tvfmadd231ps %%zmm28,%%zmm29,%%zmm23\n\t"));
  return (int)(x & 1);
}
