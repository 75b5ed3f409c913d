// The preparation pass of the prepared plans: every chunk of every (sequence, value head) is
// prepared once, chunk-parallel, by the fused kernel's producer code, and stored in the workspace
// in the compact form of KdaPrepared. One producer group a CTA, PlanArgs::prep_chunks consecutive
// chunks (a CTA's start -- finding its sequence, its pointers -- is ~3 us, worth amortising).
#pragma once

#include <cuda_fp16.h>

#include "kda_fwd_producer.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

// The preparation pass's sink (head dimension kD): k_tilde and q_tilde also go to shared memory
// (the A and M products read them there), everything else straight from registers to the
// workspace.
template <int kD>
struct WorkspaceSink {
  using Prepared = KdaPrepared<kD>;
  static constexpr int kPitchKI = KdaDims<kD>::kPitchKI;
  typename KdaPrepTraits<kD>::Tiles& tl;
  unsigned char* dst;  // this chunk's KdaPrepared
  float inv_scale;     // q_hat is stored without the output scale

  __device__ const float (*k_tilde() const)[kPitchKI] { return tl.k_tilde; }
  __device__ const float (*q_tilde() const)[kPitchKI] { return tl.q_tilde; }
  // Tokens t and t + 8 of channel c (this thread's). The workspace pairs adjacent channels of one
  // token, so the two lanes of a channel pair swap one value each: the even lane stores token t of
  // the pair, the odd lane token t + 8.
  __device__ void kq(int t, int c, const float (&k)[2], const float (&q)[2]) const {
    *reinterpret_cast<float2*>(&tl.k_tilde[t][2 * c]) = make_float2(ptx::round_tf32(k[0]), ptx::round_tf32(k[1]));
    *reinterpret_cast<float2*>(&tl.q_tilde[t][2 * c]) = make_float2(ptx::round_tf32(q[0]), ptx::round_tf32(q[1]));
    const bool odd = c & 1;
    const float k_other = __shfl_xor_sync(0xffffffffu, odd ? k[0] : k[1], 1);
    const float q_other = __shfl_xor_sync(0xffffffffu, odd ? q[0] : q[1], 1);
    const int at = 4 * Prepared::kq_word(odd ? t + 8 : t, c >> 1);  // byte offset of the word
    *reinterpret_cast<__half2*>(dst + Prepared::kKTilde + at) =
        odd ? __floats2half2_rn(k_other, k[1]) : __floats2half2_rn(k[0], k_other);
    *reinterpret_cast<__half2*>(dst + Prepared::kQHat + at) =
        odd ? __floats2half2_rn(q_other * inv_scale, q[1] * inv_scale)
            : __floats2half2_rn(q[0] * inv_scale, q_other * inv_scale);
  }
  __device__ void k_dec(int c, const float (&kd)[kChunkTokens]) const {
    uint32_t h[kChunkTokens / 2];
#pragma unroll
    for (int w = 0; w < kChunkTokens / 2; ++w) {
      const __half2 x = __floats2half2_rn(kd[2 * w], kd[2 * w + 1]);
      h[w] = *reinterpret_cast<const uint32_t*>(&x);
    }
    // Token pairs w and w + 4 are adjacent words.
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + Prepared::kKDec);
#pragma unroll
    for (int w = 0; w < 4; ++w) *reinterpret_cast<uint2*>(d + Prepared::k_dec_word(c, w)) = make_uint2(h[w], h[w + 4]);
  }
  __device__ void gamma(int c, float g) const {
    reinterpret_cast<float*>(dst + Prepared::kGamma)[Prepared::gamma_word(c)] = g;
  }
  __device__ void neg_v(int, const float (&)[kChunkTokens]) const {}
  __device__ void m(int t, int s, float x) const {
    reinterpret_cast<float*>(dst + Prepared::kM)[Prepared::square_word(t, s)] = ptx::round_tf32(x);
  }
  __device__ void neg_t(int t, int s, float x) const {
    reinterpret_cast<float*>(dst + Prepared::kNegT)[Prepared::square_word(t, s)] = ptx::round_tf32(x);
  }
};

// Byte address of prepared chunk `c` of sequence n, head hv (head dimension kD).
template <int kD>
__device__ __forceinline__ unsigned char* prepared_chunk(const PlanArgs& p, int heads_v, int n, int hv, int64_t c) {
  return p.prepared + ((p.seq.chunk_off[n] + c) * heads_v + hv) * int64_t(KdaPrepared<kD>::kBytes);
}

// kD: the head dimension; kSoftplus: the softplus gate's producer (docs/spec.md, "Gate forms").
template <int kD, bool kSoftplus>
__global__ void __launch_bounds__(KdaPrepTraits<kD>::kThreads, KdaPrepTraits<kD>::kCtasPerSm)
    kda_prep_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  using Tr = KdaPrepTraits<kD>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  if (fused_chosen(a)) return;
  const int hv = blockIdx.x % a.heads_v;
  int n;
  int64_t block;
  // Every warp finds the sequence itself (the same answer): no broadcast, no extra barrier.
  if (!locate(p.seq.prep_off, a.num_seqs, blockIdx.x / a.heads_v, n, block)) return;
  const WorkUnit w = table_unit(a, p.seq, n, hv, 0);
  if (w.skip) return;  // a padding sequence is never read
  const int nchunks = int(chunk_count(w.len, w.shift));
  const int c0 = int(block) * p.prep_chunks, c1 = min(c0 + p.prep_chunks, nchunks);
  const float inv_scale = a.scale != 0.f ? 1.f / a.scale : 0.f;
  unsigned char* base = prepared_chunk<kD>(p, a.heads_v, n, hv, 0);
  const int64_t stride = int64_t(a.heads_v) * KdaPrepared<kD>::kBytes;
  KdaProducer<Tr, kSoftplus> producer(a, w, sm.group, 0, threadIdx.x);
  producer.run_chunks(
      c0, 1, c1, [&](int i) { return WorkspaceSink<kD>{sm.tiles, base + i * stride, inv_scale}; }, [](int) {},
      [](int) {});
}

}  // namespace flash_kda::cuda::sm90
