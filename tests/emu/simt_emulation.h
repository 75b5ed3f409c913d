// A host emulation of the device primitives the sm90 kernels use, so that their code runs on a CPU
// (tests/emu, docs/testing.md "Kernels on the CPU"): every thread of a CTA is a fiber (ucontext),
// CTAs run one after another, and a fiber yields whenever it waits (a warp collective, a named
// barrier, an mbarrier). Warp collectives rendezvous all live lanes of the warp and are computed
// when the last one arrives: mma.sync (f16 and tf32, fragment layouts as in src/cuda/common/ptx.cuh),
// ldmatrix .trans, shuffles, votes, __syncwarp. Asynchronous copies (cp.async, bulk copies) land at
// once, so the emulation checks the kernels' arithmetic, indexing and hand-off protocol (a wait
// that can never complete is reported as a deadlock), not their timing or memory ordering: that
// stays compute-sanitizer's job on the GPU. Transcendentals are the exact host functions with the
// hardware's flush of subnormal results.
//
// Included by src/cuda/common/ptx.cuh and bulk_copy.cuh when FLASH_KDA_SIMT_EMULATION is defined
// (the emulated test build compiles the kernels' headers with the host compiler).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __noinline__
#define __noinline__ __attribute__((noinline))
#undef __grid_constant__
#define __grid_constant__
#undef __global__
#define __global__ static  // (internal linkage: the library's own kernel stubs keep their names)
#undef __shared__
#define __shared__ static  // (static shared variables: one CTA runs at a time)
#undef __align__
#define __align__(n) alignas(n)

namespace flash_kda::emu {

struct Dim3 {
  unsigned x, y, z;
};

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  bool done = false;
};

// Inputs and outputs of one warp collective, per lane.
struct Rendezvous {
  uint64_t gen = 0;
  int arrived = 0;
  int op = 0;
  unsigned mask = 0;  // the lanes taking part (from the first to arrive)
  alignas(16) unsigned char in[32][64];
  alignas(16) unsigned char out[32][64];
};

// A warp's collectives in progress: lanes of disjoint masks can wait in different ones at once
// (__syncwarp(0xffff) by lanes 0-15 while lanes 16-31 wait in a full-mask one), one slot each.
struct WarpRendezvous {
  static constexpr int kSlots = 4;
  Rendezvous slot[kSlots];
};

struct NamedBarrier {
  int arrived = 0;
  uint64_t gen = 0;
};

// What the emulation keeps in a CUtensorMap's 128 bytes (src/cuda/sm90/kda_raw_maps.h makes it): a
// rank-4 tensor of 2-byte elements, dimensions innermost first, strides of dimensions 1..3 in bytes.
struct EmuTensorMap {
  const void* base;
  uint64_t dim[4];
  uint64_t stride[3];
  uint32_t box[4];
};

struct MBarrier {
  int expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t completed = 0;  // phases completed
};

struct Cta {
  int threads = 0;
  unsigned block = 0;
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  int cur = -1;
  std::vector<WarpRendezvous> warps;
  NamedBarrier bars[16];
  std::map<const void*, MBarrier> mbarriers;
  std::vector<unsigned char> smem;
  uint64_t progress = 0;  // state changes: the scheduler's deadlock detection
  const std::function<void()>* body = nullptr;
};

inline Cta* g_cta = nullptr;
inline unsigned g_grid = 0;
inline std::string g_failure;  // the first failure of the current launch (deadlock, mismatch)

inline Dim3 thread_idx() { return {unsigned(g_cta->cur), 0u, 0u}; }
inline Dim3 block_idx() { return {g_cta->block, 0u, 0u}; }
inline Dim3 block_dim() { return {unsigned(g_cta->threads), 1u, 1u}; }
inline Dim3 grid_dim() { return {g_grid, 1u, 1u}; }
// 128-byte aligned, as the device's (tensor copies need it)
inline unsigned char* dynamic_smem() {
  const uintptr_t p = reinterpret_cast<uintptr_t>(g_cta->smem.data());
  return g_cta->smem.data() + ((128 - p % 128) % 128);
}

[[noreturn]] inline void fail(const std::string& what) {
  throw std::runtime_error("simt emulation: " + what + " (block " + std::to_string(g_cta->block) + ", thread " +
                           std::to_string(g_cta->cur) + ")");
}

inline void yield() { swapcontext(&g_cta->fibers[g_cta->cur].ctx, &g_cta->scheduler); }

// The lanes of `mask` in `warp` that have not exited.
inline int live_lanes(int warp, unsigned mask = 0xffffffffu) {
  int n = 0;
  for (int l = 0; l < 32; ++l) {
    const int t = 32 * warp + l;
    if ((mask >> l & 1u) && t < g_cta->threads && !g_cta->fibers[t].done) ++n;
  }
  return n;
}

// One warp collective: every live lane of `mask` contributes `in`; the last to arrive runs
// `compute(ins, outs)` over the 32 slots (those of lanes that have exited or are outside the mask
// hold stale bytes).
template <class Out, class In, class F>
Out warp_collective(int op, const In& in, F compute, unsigned mask = 0xffffffffu) {
  static_assert(sizeof(In) <= 64 && sizeof(Out) <= 64, "collective operands fit a slot");
  Cta& c = *g_cta;
  const int warp = c.cur / 32, lane = c.cur % 32;
  if (!(mask >> lane & 1u)) fail("a lane reached a warp collective whose mask leaves it out");
  // The collective of this lane's mask in progress, else a free slot. One of another mask that
  // includes this lane may be pending (the lane joins it later); one of the same mask and another op
  // is a mismatch.
  Rendezvous* rp = nullptr;
  for (Rendezvous& s : c.warps[warp].slot) {
    if (s.arrived == 0 || s.mask != mask) continue;
    if (s.op != op)
      fail("lanes of a warp reached different collectives (" + std::to_string(s.op) + " vs " + std::to_string(op) + ")");
    rp = &s;
  }
  if (rp == nullptr) {
    for (Rendezvous& s : c.warps[warp].slot)
      if (s.arrived == 0) {
        rp = &s;
        break;
      }
    if (rp == nullptr) fail("more warp collectives in progress at once than the emulation has slots");
    rp->op = op;
    rp->mask = mask;
  }
  Rendezvous& r = *rp;
  std::memcpy(r.in[lane], &in, sizeof(In));
  const uint64_t gen = r.gen;
  if (++r.arrived == live_lanes(warp, mask)) {
    In ins[32];
    Out outs[32];
    for (int l = 0; l < 32; ++l) std::memcpy(&ins[l], r.in[l], sizeof(In));
    compute(ins, outs);
    for (int l = 0; l < 32; ++l)  // (only the lanes taking part: others may not have read their last result yet)
      if (mask >> l & 1u) std::memcpy(r.out[l], &outs[l], sizeof(Out));
    r.arrived = 0;
    ++r.gen;
    ++c.progress;
  } else {
    while (r.gen == gen) yield();
  }
  Out o;
  std::memcpy(&o, r.out[lane], sizeof(Out));
  return o;
}

enum Op { kSyncWarp = 1, kShflXor, kShflUp, kShflIdx, kBallot, kAll, kMmaF16, kMmaTf32, kLdmatrixT };

struct Empty {};

inline void syncwarp(unsigned mask) {
  warp_collective<Empty>(kSyncWarp, Empty{}, [](const Empty*, Empty*) {}, mask);
}

template <class T>
T shfl_xor(T v, int mask) {
  struct In {
    T v;
    int mask;
  };
  return warp_collective<T>(kShflXor, In{v, mask}, [](const In* in, T* out) {
    for (int l = 0; l < 32; ++l) out[l] = in[l ^ (in[l].mask & 31)].v;
  });
}

template <class T>
T shfl_idx(T v, int src) {
  struct In {
    T v;
    int src;
  };
  return warp_collective<T>(kShflIdx, In{v, src}, [](const In* in, T* out) {
    for (int l = 0; l < 32; ++l) out[l] = in[in[l].src & 31].v;
  });
}

template <class T>
T shfl_up(T v, unsigned delta) {
  struct In {
    T v;
    unsigned delta;
  };
  return warp_collective<T>(kShflUp, In{v, delta}, [](const In* in, T* out) {
    for (int l = 0; l < 32; ++l) out[l] = l >= int(in[l].delta) ? in[l - in[l].delta].v : in[l].v;
  });
}

inline unsigned ballot(bool p) {
  return warp_collective<unsigned>(kBallot, int(p), [](const int* in, unsigned* out) {
    unsigned b = 0;
    for (int l = 0; l < 32; ++l) b |= unsigned(in[l] != 0) << l;
    for (int l = 0; l < 32; ++l) out[l] = b;
  });
}

inline bool all(bool p) {
  return warp_collective<int>(kAll, int(p), [](const int* in, int* out) {
    int a = 1;
    for (int l = 0; l < 32; ++l) a &= in[l] != 0;
    for (int l = 0; l < 32; ++l) out[l] = a;
  }) != 0;
}

inline float half_bits(uint32_t w, int hi) { return __half2float(__ushort_as_half(uint16_t(hi ? w >> 16 : w & 0xffff))); }
inline float tf32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xffffe000u;  // the tensor core reads the top 19 bits
  std::memcpy(&x, &u, 4);
  return x;
}

// The m16n8kK product of the MMAs below: C += A B, each entry accumulated in double (the fp16 / tf32
// operands' products are exact there) and rounded to fp32 once; and lane l's fragment of the 16 x 8
// accumulator (rows l / 4 and l / 4 + 8, columns 2 (l % 4) and + 1).
template <int K>
inline void mma_product(const float (&A)[16][K], const float (&B)[K][8], float (&C)[16][8]) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = C[i][j];
      for (int k = 0; k < K; ++k) s += double(A[i][k]) * B[k][j];
      C[i][j] = float(s);
    }
}
inline void c_fragment(const float (&C)[16][8], int l, float (&d)[4]) {
  const int g = l / 4, t = l % 4;
  d[0] = C[g][2 * t], d[1] = C[g][2 * t + 1], d[2] = C[g + 8][2 * t], d[3] = C[g + 8][2 * t + 1];
}

// mma.sync m16n8k16 f16 x f16 + f32 (fragments as documented in ptx.cuh).
inline void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct In {
    uint32_t a[4], b0, b1;
    float d[4];
  };
  struct Out {
    float d[4];
  };
  In in{{a[0], a[1], a[2], a[3]}, b0, b1, {d[0], d[1], d[2], d[3]}};
  const Out o = warp_collective<Out>(kMmaF16, in, [](const In* x, Out* out) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int h = 0; h < 2; ++h) {
        A[g][2 * t + h] = half_bits(x[l].a[0], h);
        A[g + 8][2 * t + h] = half_bits(x[l].a[1], h);
        A[g][2 * t + 8 + h] = half_bits(x[l].a[2], h);
        A[g + 8][2 * t + 8 + h] = half_bits(x[l].a[3], h);
        B[2 * t + h][g] = half_bits(x[l].b0, h);
        B[2 * t + 8 + h][g] = half_bits(x[l].b1, h);
      }
      C[g][2 * t] = x[l].d[0], C[g][2 * t + 1] = x[l].d[1];
      C[g + 8][2 * t] = x[l].d[2], C[g + 8][2 * t + 1] = x[l].d[3];
    }
    mma_product(A, B, C);
    for (int l = 0; l < 32; ++l) c_fragment(C, l, out[l].d);
  });
  for (int r = 0; r < 4; ++r) d[r] = o.d[r];
}

// mma.sync m16n8k8 tf32 x tf32 + f32.
inline void mma_tf32(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
  struct In {
    float a[4], b[2], d[4];
  };
  struct Out {
    float d[4];
  };
  In in{{a0, a1, a2, a3}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  const Out o = warp_collective<Out>(kMmaTf32, in, [](const In* x, Out* out) {
    float A[16][8], B[8][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      A[g][t] = tf32_bits(x[l].a[0]), A[g + 8][t] = tf32_bits(x[l].a[1]);
      A[g][t + 4] = tf32_bits(x[l].a[2]), A[g + 8][t + 4] = tf32_bits(x[l].a[3]);
      B[t][g] = tf32_bits(x[l].b[0]), B[t + 4][g] = tf32_bits(x[l].b[1]);
      C[g][2 * t] = x[l].d[0], C[g][2 * t + 1] = x[l].d[1];
      C[g + 8][2 * t] = x[l].d[2], C[g + 8][2 * t + 1] = x[l].d[3];
    }
    mma_product(A, B, C);
    for (int l = 0; l < 32; ++l) c_fragment(C, l, out[l].d);
  });
  for (int r = 0; r < 4; ++r) d[r] = o.d[r];
}

// ldmatrix.sync.aligned.m8n8.x4.trans.b16: lanes 8m .. 8m + 7 give the rows of matrix m.
inline uint4 ldmatrix_x4_trans(const void* row) {
  struct Out {
    uint32_t r[4];
  };
  const Out o = warp_collective<Out>(kLdmatrixT, row, [](const void* const* rows, Out* out) {
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const auto* lo = static_cast<const uint16_t*>(rows[8 * m + 2 * (l % 4)]);
        const auto* hi = static_cast<const uint16_t*>(rows[8 * m + 2 * (l % 4) + 1]);
        out[l].r[m] = uint32_t(lo[l / 4]) | uint32_t(hi[l / 4]) << 16;
      }
  });
  return make_uint4(o.r[0], o.r[1], o.r[2], o.r[3]);
}

// Named barrier `id` of `count` threads (bar.sync waits, bar.arrive does not).
inline void named_barrier(int id, int count, bool wait) {
  Cta& c = *g_cta;
  if (id < 0 || id > 15) fail("named barrier id " + std::to_string(id));
  NamedBarrier& b = c.bars[id];
  const uint64_t gen = b.gen;
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.gen;
    ++c.progress;
    return;
  }
  ++c.progress;
  if (wait)
    while (b.gen == gen) yield();
}

inline MBarrier& mbarrier(const void* bar) {
  auto it = g_cta->mbarriers.find(bar);
  if (it == g_cta->mbarriers.end()) fail("mbarrier used before mbarrier.init");
  return it->second;
}
inline void mbarrier_check(MBarrier& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.completed;
    m.pending = m.expected;
  }
  ++g_cta->progress;
}

// Runs `body` as a kernel of `grid` CTAs of `threads` threads with `smem_bytes` of dynamic shared
// memory (poisoned with 0xff at every CTA's start). Throws on a deadlock or a collective mismatch.
inline void launch(unsigned grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  constexpr size_t kStack = 256 * 1024;
  g_grid = grid;
  for (unsigned b = 0; b < grid; ++b) {
    Cta c;
    c.threads = threads;
    c.block = b;
    c.fibers.resize(threads);
    c.warps.resize((threads + 31) / 32);
    c.smem.assign(smem_bytes + 128 + 16, 0xff);
    c.body = &body;
    g_cta = &c;
    for (int t = 0; t < threads; ++t) {
      Fiber& f = c.fibers[t];
      f.stack.reset(new char[kStack]);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = &c.scheduler;
      makecontext(&f.ctx, +[] {
        Cta& cta = *g_cta;
        try {
          (*cta.body)();
        } catch (const std::exception& e) {
          if (g_failure.empty()) g_failure = e.what();
        }
        cta.fibers[cta.cur].done = true;
        ++cta.progress;
        // A warp waiting in a collective for this lane completes without it.
        const int warp = cta.cur / 32;
        for (const Rendezvous& r : cta.warps[warp].slot)
          if (r.arrived > 0 && r.arrived == live_lanes(warp, r.mask) && g_failure.empty())
            g_failure = "a lane exited while its warp waited in a collective";
      }, 0);
    }
    for (;;) {
      bool any = false;
      const uint64_t before = c.progress;
      for (int t = 0; t < threads; ++t) {
        if (c.fibers[t].done) continue;
        any = true;
        c.cur = t;
        swapcontext(&c.scheduler, &c.fibers[t].ctx);
        if (!g_failure.empty()) break;
      }
      if (!g_failure.empty() || !any) break;
      if (c.progress == before) {
        g_failure = "deadlock: every live thread waits (block " + std::to_string(b) + ")";
        break;
      }
    }
    g_cta = nullptr;
    if (!g_failure.empty()) {
      const std::string f = g_failure;
      g_failure.clear();
      throw std::runtime_error(f);
    }
  }
}

}  // namespace flash_kda::emu

// ---- the CUDA builtins the kernels call --------------------------------------------------------

#define threadIdx (::flash_kda::emu::thread_idx())
#define blockIdx (::flash_kda::emu::block_idx())
#define blockDim (::flash_kda::emu::block_dim())
#define gridDim (::flash_kda::emu::grid_dim())

inline void __syncwarp(unsigned mask = 0xffffffffu) { flash_kda::emu::syncwarp(mask); }
inline void __syncthreads() { flash_kda::emu::named_barrier(0, flash_kda::emu::g_cta->threads, true); }
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return flash_kda::emu::shfl_xor(v, mask);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return flash_kda::emu::shfl_idx(v, src);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  return flash_kda::emu::shfl_up(v, delta);
}
inline unsigned __ballot_sync(unsigned, int p) { return flash_kda::emu::ballot(p != 0); }
inline int __all_sync(unsigned, int p) { return flash_kda::emu::all(p != 0); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
template <class T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
using std::isfinite;
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  if (v > old) *p = v;
  return old;
}

// ---- used by the decode kernel (src/cuda/sm90/kda_decode_sm90.cuh) ------------------------------

// Streaming store (st.global.cs): the cache hint has no effect on the value.
template <class T>
inline void __stcs(T* p, T v) {
  *p = v;
}
// __expf is ex2.approx.ftz of the fp32 product x · log2(e): the product's rounding is kept, the
// exponential itself exact (as the other transcendentals here), subnormal results flushed to zero.
inline float __expf(float x) {
  const float y = x * 1.44269504f;
  const float r = std::exp2(std::fabs(y) < 1.17549435e-38f ? 0.0f : y);
  return std::fabs(r) < 1.17549435e-38f ? 0.0f : r;
}
// __fdividef(x, y) is x · rcp.approx(y): 0 for 2^126 < |y| < 2^128 (as the CUDA documentation of the
// intrinsic states), subnormals flushed.
inline float __fdividef(float x, float y) {
  auto ftz = [](float v) { return std::fabs(v) < 1.17549435e-38f ? std::copysign(0.0f, v) : v; };
  const float ay = std::fabs(y);
  if (ay > 8.50705917e37f && ay < INFINITY) return ftz(x * 0.0f);
  return ftz(ftz(x) * ftz(1.0f / ftz(y)));
}
