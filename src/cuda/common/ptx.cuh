// Thin wrappers around the PTX instructions the kernels use: tf32 tensor-core MMA, asynchronous
// global->shared copies, named barriers, fast transcendental functions.
#pragma once

#include <cstdint>

// A kernel's dynamic shared memory, as the byte array `name`.
#ifdef FLASH_KDA_SIMT_EMULATION
#define FLASH_KDA_DYNAMIC_SMEM(name) unsigned char* name = ::flash_kda::emu::dynamic_smem()
#else
#define FLASH_KDA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

#ifdef FLASH_KDA_SIMT_EMULATION
// The host emulation of these primitives (tests/emu/simt_emulation.h): the kernels' code then runs
// on a CPU, one fiber a thread.
#include "simt_emulation.h"

namespace flash_kda::cuda::ptx {

__device__ __forceinline__ float round_tf32(float x) { return __uint_as_float(__float_as_uint(x) + 0x1000u); }
__device__ __forceinline__ float tf32_rest(float x) { return x - __uint_as_float(__float_as_uint(x) & 0xffffe000u); }
__device__ __forceinline__ float round_tf32_by(float x, uint32_t half_ulp) { return __uint_as_float(__float_as_uint(x) + half_ulp); }
inline float select_eq(int a, int b, float if_equal, float otherwise) { return a == b ? if_equal : otherwise; }
inline void mma_tf32(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
  emu::mma_tf32(d, a0, a1, a2, a3, b0, b1);
}
inline void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { emu::mma_f16(d, a, b0, b1); }
inline uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t r;
  std::memcpy(&r, &h, 4);
  return r;
}
inline uint4 ldmatrix_x4_trans(const void* smem_row) { return emu::ldmatrix_x4_trans(smem_row); }
inline void cp_async_16(void* smem, const void* gmem, uint32_t src_bytes) {
  std::memset(smem, 0, 16);
  if (src_bytes) std::memcpy(smem, gmem, src_bytes < 16 ? src_bytes : 16);
}
inline void cp_async_4(void* smem, const void* gmem) { std::memcpy(smem, gmem, 4); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline void bar_sync(int id, int count) {
  __syncwarp();
  emu::named_barrier(id, count, true);
}
inline void bar_arrive(int id, int count) {
  __syncwarp();
  emu::named_barrier(id, count, false);
}
// Programmatic dependent launch (below): nothing to wait for on the CPU, one kernel runs at a time.
inline void wait_for_prior_grid() {}
inline void allow_dependents() {}
// setmaxnreg: the emulation has no register file to share out.
template <int N>
inline void setmaxnreg_inc() {}
template <int N>
inline void setmaxnreg_dec() {}
// ex2.approx.ftz / rcp.approx.ftz: exact values, subnormal results flushed to zero
inline float ftz(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.f, x) : x; }
inline float ex2(float x) { return ftz(std::exp2(ftz(x))); }
inline float rcp(float x) { return ftz(1.f / ftz(x)); }
inline const void* as_ptr(const void* base, int64_t byte_offset) { return static_cast<const char*>(base) + byte_offset; }

}  // namespace flash_kda::cuda::ptx

#else  // the device code

namespace flash_kda::cuda::ptx {

// Rounds fp32 to tf32 to nearest (ties away from zero) for the tensor cores, which read the top 19
// bits of a tf32 operand and ignore the low 13: adding half a tf32 ulp (bit 12) to the magnitude
// bits and letting the MMA truncate is one integer add instead of a conversion instruction.
__device__ __forceinline__ float round_tf32(float x) { return __uint_as_float(__float_as_uint(x) + 0x1000u); }
// What an MMA does not read of x: x minus its tf32 truncation (exact in fp32), for a second term.
__device__ __forceinline__ float tf32_rest(float x) { return x - __uint_as_float(__float_as_uint(x) & 0xffffe000u); }
// round_tf32 where `half_ulp` is 0x1000, x unchanged where it is 0: the choice made once, outside a
// loop, costs no select per value.
__device__ __forceinline__ float round_tf32_by(float x, uint32_t half_ulp) { return __uint_as_float(__float_as_uint(x) + half_ulp); }
// a == b ? if_equal : otherwise, as one select the compiler keeps: a chain of them over a register
// array with a run-time index would otherwise become an indexed access to local memory.
__device__ __forceinline__ float select_eq(int a, int b, float if_equal, float otherwise) {
  float r;
  asm("{\n .reg .pred p;\n setp.eq.s32 p, %1, %2;\n selp.f32 %0, %3, %4, p;\n}\n"
      : "=f"(r)
      : "r"(a), "r"(b), "f"(if_equal), "f"(otherwise));
  return r;
}

// D = A(16x8, row) * B(8x8, col) + D with tf32 operands and fp32 accumulation.
// Fragments (g = lane / 4, t = lane % 4):
//   a0 (g, t)   a1 (g+8, t)   a2 (g, t+4)   a3 (g+8, t+4)
//   b0 (k=t, n=g)   b1 (k=t+4, n=g)
//   d0 (g, 2t)  d1 (g, 2t+1)  d2 (g+8, 2t)  d3 (g+8, 2t+1)
__device__ __forceinline__ void mma_tf32(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), "r"(__float_as_uint(a3)),
        "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

// D = A(16x16, row) * B(16x8, col) + D with fp16 operands and fp32 accumulation. Each register
// holds two fp16 values of adjacent k (the lower k in the low half):
//   a0 (g, 2t..2t+1)   a1 (g+8, 2t..2t+1)   a2 (g, 2t+8..2t+9)   a3 (g+8, 2t+8..2t+9)
//   b0 (k=2t..2t+1, n=g)   b1 (k=2t+8..2t+9, n=g)
//   d as for mma_tf32
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one fp16x2 register (round to nearest even; lo in the low half). Magnitudes
// of 65520 and above become infinities, which the callers detect.
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four 8x8 b16 matrices from shared memory, transposed (ldmatrix .trans): lanes 8m..8m+7 give the
// addresses of matrix m's eight 16-byte rows; register m of lane l then holds elements (2(l % 4), l / 4)
// and (2(l % 4) + 1, l / 4) of matrix m (row, column as stored), the lower row in the low half.
__device__ __forceinline__ uint4 ldmatrix_x4_trans(const void* smem_row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  uint4 r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(s));
  return r;
}

// 16-byte asynchronous copy global -> shared; `src_bytes` < 16 zero-fills the rest (0: all zeros,
// nothing is read).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, uint32_t src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
// 4-byte asynchronous copy global -> shared (both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Named barriers (ids 1..15; 0 is __syncthreads). `count` is the number of threads, a multiple of 32.
// bar.sync / bar.arrive are .aligned: every lane of the warp must execute them together, so each
// call first reconverges the warp (a lane that left a divergent branch early would otherwise
// arrive for the whole warp before its siblings finished writing).
__device__ __forceinline__ void bar_sync(int id, int count) {
  __syncwarp();
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  __syncwarp();
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Programmatic dependent launch (docs/kernel.md, "Pipeline"). A kernel launched with the
// programmatic-serialization attribute is scheduled as the CTAs of the kernel before it in the stream
// exit, not after that grid has drained and its completion been processed; wait_for_prior_grid()
// blocks until that kernel has completed and its memory is visible (a no-op for a kernel launched
// without the attribute).
__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Lets the kernel after this one in the stream, if launched with that attribute, be scheduled now
// rather than as this grid's CTAs exit (the plan kernel: one CTA, and the preparation may start
// beside it).
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// Register reallocation between the warpgroups of a CTA (sm_90a): every warp of a warpgroup executes
// the same one; dec returns registers above N a thread to the CTA's pool, inc blocks until the pool
// can raise the warpgroup to N. The pool is what the CTA got at launch (the kernel's register count
// times its threads), so the counts must balance against __launch_bounds__.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ const void* as_ptr(const void* base, int64_t byte_offset) {
  return static_cast<const char*>(base) + byte_offset;
}

}  // namespace flash_kda::cuda::ptx

#endif  // FLASH_KDA_SIMT_EMULATION
