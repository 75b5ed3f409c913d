// The sm90 forward kernel: a scheduler picks the work unit, the first warps take the producer role
// (two groups of D / 32 warps: warps 0-7 at D = 128, 0-3 at D = 64) and the remaining warps the
// consumer role (see kda_fwd_traits.cuh for the shape).
#pragma once

#include "kda_fwd_consumer.cuh"
#include "kda_fwd_producer.cuh"
#include "kda_fwd_scheduler.cuh"
#include "kda_fwd_traits.cuh"
#include "kda_prep.cuh"

namespace flash_kda::cuda::sm90 {

// The fused kernel's sink on compact stages (KdaFwdTraits::kCompact): the preparation pass's
// (WorkspaceSink: k_tilde and q_tilde to the group's fp32 tiles for A and M, the chunk's compact form
// into the stage), and v, which the preparation pass leaves to the recurrence kernel's loader: this
// thread's column c (a value row) of the stage's [token][row] bf16 rows, the raw bits of v (-nv is
// v exactly: nv is a bf16 value negated).
template <int kD, int kVRows>
struct CompactStageSink : WorkspaceSink<kD> {
  uint16_t (*v)[kVRows + 8];
  __device__ void neg_v(int c, const float (&nv)[kChunkTokens]) const {
#pragma unroll
    for (int t = 0; t < kChunkTokens; ++t) v[t][c] = uint16_t(__float_as_uint(-nv[t]) >> 16);
  }
};

// kSoftplus: the softplus gate's producer (docs/spec.md, "Gate forms"); the consumers are the same.
template <class Tr, bool kSoftplus>
__global__ void __launch_bounds__(Tr::kThreads, 1) kda_fwd_kernel(const __grid_constant__ KdaFwdArgs args) {
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  if (args.device_plan != nullptr && *args.device_plan != 1) return;  // the prepared kernels run instead
  const WorkUnit work = schedule_work(args, sm.scheduled_seq);
  if (work.skip) return;  // uniform over the CTA, before any barrier
  const int warp = threadIdx.x >> 5;
  if (warp < Tr::kProducerWarps) {
    const int group = warp / (Tr::kGroupThreads / 32);
    KdaProducer<Tr, kSoftplus> producer(args, work, sm.group[group], group, threadIdx.x % Tr::kGroupThreads);
    const uint32_t t_round = neg_t_rounding(args);
    if constexpr (Tr::kCompact) {
      const float inv_scale = args.scale != 0.f ? 1.f / args.scale : 0.f;  // (q_hat and M without scale)
      producer.run([&](int i) {
        auto& st = sm.stage[i % Tr::kStages];
        return CompactStageSink<Tr::kDim, Tr::kVRows>{{sm.tiles[group], st.prepared, inv_scale, t_round}, st.v};
      });
    } else {
      producer.run([&](int i) { return StageSink<typename Tr::Stage>{sm.stage[i % Tr::kStages], t_round}; });
    }
  } else {
    using View = std::conditional_t<Tr::kCompact, CompactStageView<Tr>, Fp32StageView<Tr>>;
    const RowsIO io = whole_sequence_rows<Tr::kDim>(args, work, Tr::kVRows);
    KdaConsumer<Tr, View>(args, work, io, sm, warp - Tr::kProducerWarps, threadIdx.x & 31).run();
  }
}

// Whether the fused kernel runs on compact stages (KdaFwdTraits::kCompact: fp16 tiles and products,
// as the recurrence kernel's) or on fp32 tiles with tf32 products (docs/kernel.md, "Compact stages
// in the fused kernel"). Measured on an H100 against fp32 stages: the fused rows 4.7-7.5 % faster
// (docs/perf_log.md, session 28).
constexpr bool kFusedCompactStages = true;

// Host-side launcher of one instantiation (head dimension kD; defined in kda_fwd_sm90.cu and
// kda_fwd64_sm90.cu).
template <int kD, int kConsumerWarps>
cudaError_t launch_kda_fwd(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream);

}  // namespace flash_kda::cuda::sm90
