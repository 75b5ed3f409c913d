// sm_90 bulk copies (the TMA engine, without a tensor map for a contiguous block, with one for a box
// of a strided tensor) and the mbarrier that reports their completion: one thread moves the data
// into shared memory with one instruction, and no register holds it while it is in flight.
#pragma once

#include <cuda.h>  // CUtensorMap

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

// A box of a tensor map (kda_raw_maps.h: the emulation's descriptor is EmuTensorMap, inside the
// CUtensorMap's bytes): elements outside the tensor read as zeros, as the TMA engine fills them.
inline void tensor_copy_g2s_4d(void* smem, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  const emu::EmuTensorMap& d = *reinterpret_cast<const emu::EmuTensorMap*>(map);
  if (reinterpret_cast<uintptr_t>(smem) % 128 != 0) emu::fail("tensor copy: shared-memory address not 128-byte aligned");
  auto* out = static_cast<uint16_t*>(smem);
  const int64_t c[4] = {c0, c1, c2, c3};
  uint32_t bytes = 0;
  for (uint32_t l = 0; l < d.box[3]; ++l)
    for (uint32_t k = 0; k < d.box[2]; ++k)
      for (uint32_t j = 0; j < d.box[1]; ++j)
        for (uint32_t i = 0; i < d.box[0]; ++i) {
          const int64_t x[4] = {c[0] + i, c[1] + j, c[2] + k, c[3] + l};
          bool in = true;
          for (int r = 0; r < 4; ++r) in = in && x[r] >= 0 && x[r] < int64_t(d.dim[r]);
          uint16_t v = 0;
          if (in)
            std::memcpy(&v, static_cast<const char*>(d.base) + 2 * x[0] + d.stride[0] * x[1] + d.stride[1] * x[2] +
                                d.stride[2] * x[3], 2);
          *out++ = v;
          bytes += 2;
        }
  emu::MBarrier& m = emu::mbarrier(bar);
  m.tx -= bytes;
  emu::mbarrier_check(m);
}
inline void fence_proxy_async_shared() {}

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

// Copies the box of `map` at element coordinates (c0, c1, c2, c3) (innermost first; a box reaching
// outside the tensor reads zeros there) into this CTA's shared memory at `smem` (128-byte aligned),
// densely, innermost dimension first; completion is reported to `bar` as transaction bytes. `map` is
// a kernel parameter (__grid_constant__). A lone CTA is its own cluster, so the .shared::cluster
// destination is this CTA's shared memory.
__device__ __forceinline__ void tensor_copy_g2s_4d(void* smem, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                                   uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_address(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(bar))
      : "memory");
}

// Orders this thread's earlier generic-proxy accesses of shared memory before later async-proxy ones
// (a bulk or tensor copy into the same bytes).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace flash_kda::cuda

#endif  // FLASH_KDA_SIMT_EMULATION
