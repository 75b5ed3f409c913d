// Runs a per-(sequence, head) runner of the CPU backend with the widest SIMD kernel this CPU has.
#pragma once

#include "head_task.h"
#include "simd.h"

namespace flash_kda::cpu {

// `Runner<W>(params, task, scratch).run()` processes one (sequence, head) with W-wide vectors. The
// kernel is picked once per process, so every call (and every sequence of a call) takes the same
// arithmetic path; FLASH_KDA_CPU_ISA=portable forces the 4-wide baseline, which is how the tests
// cover it on AVX2 machines.
template <template <int> class Runner, class Scratch>
struct IsaDispatch {
  using RunHead = void (*)(const HostRun&, const HeadTask&, Scratch&);

  static void run_portable(const HostRun& r, const HeadTask& task, Scratch& scratch) {
    Runner<4>(r, task, scratch).run();
  }
#if defined(__x86_64__)
  // The same code compiled for AVX2 + FMA (the runners and Simd are always_inline, so all of it
  // takes this function's target): 8-wide vectors and fused multiply-adds.
  __attribute__((target("avx2,fma"))) static void run_avx2(const HostRun& r, const HeadTask& task, Scratch& scratch) {
    Runner<8>(r, task, scratch).run();
  }
#endif

  static RunHead select() {
#if defined(__x86_64__)
    if (use_avx2_kernels()) return run_avx2;
#endif
    return run_portable;
  }

  static Status run(const HostRun& r) {
    static const RunHead run_head = select();
    return for_each_head<Scratch>(r, [&](const HeadTask& task, Scratch& scratch) { run_head(r, task, scratch); });
  }
};

}  // namespace flash_kda::cpu
