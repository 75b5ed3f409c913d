// sm_90 bulk copies (the TMA engine without a tensor map) and the mbarrier that reports their
// completion: one thread moves a contiguous block of global memory into shared memory with one
// instruction, and no register holds the data while it is in flight.
#pragma once

#include <cstdint>

#ifdef FLASH_KDA_SIMT_EMULATION
#include "simt_emulation.h"

// (host emulation, tests/emu/simt_emulation.h: copies land at once)
namespace flash_kda::cuda {

inline void mbarrier_init(uint64_t* bar, uint32_t count) {
  emu::MBarrier& m = emu::g_cta->mbarriers[bar];
  m = emu::MBarrier{int(count), int(count), 0, 0};
}
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  emu::MBarrier& m = emu::mbarrier(bar);
  m.tx += bytes;
  --m.pending;
  emu::mbarrier_check(m);
}
inline void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) { emu::mbarrier(bar).tx += bytes; }
inline void cp_async_mbarrier_arrive(uint64_t* bar) {
  emu::MBarrier& m = emu::mbarrier(bar);
  --m.pending;
  emu::mbarrier_check(m);
}
inline void mbarrier_arrive(uint64_t* bar) { cp_async_mbarrier_arrive(bar); }
inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while ((emu::mbarrier(bar).completed & 1) == parity) emu::yield();
}
inline void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(smem) % 16 != 0 || reinterpret_cast<uintptr_t>(gmem) % 16 != 0)
    emu::fail("bulk copy: size or address not a multiple of 16");
  std::memcpy(smem, gmem, bytes);
  emu::MBarrier& m = emu::mbarrier(bar);
  m.tx -= bytes;
  emu::mbarrier_check(m);
}

}  // namespace flash_kda::cuda

#else  // the device code

namespace flash_kda::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initialises an mbarrier that completes one phase after `count` arrivals (and the transaction bytes
// announced by them), and makes the initialisation visible to the async proxy (the bulk copy).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // (a lone CTA is its own cluster)
}

// Arrives on `bar` announcing `bytes` of transactions that must complete before its phase does.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// Announces `bytes` of transactions that must complete before the current phase of `bar` does,
// without arriving.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// One of `bar`'s expected arrivals, made when every cp.async this thread issued before has landed
// (.noinc: the arrival is one of those counted at initialisation).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Arrives on `bar` (one of its expected arrivals; release semantics for this thread's prior writes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Waits until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to this CTA's shared
// memory; completion is reported to `bar` as transaction bytes. The .shared::cta destination (PTX ISA
// 8.6, CUDA 12.8) needs no cluster launch.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_address(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

}  // namespace flash_kda::cuda

#endif  // FLASH_KDA_SIMT_EMULATION
