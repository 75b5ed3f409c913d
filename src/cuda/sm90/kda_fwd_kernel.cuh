// The sm90 forward kernel: a scheduler picks the work unit, the first warps take the producer role
// (two groups of D / 32 warps: warps 0-7 at D = 128, 0-3 at D = 64) and the remaining warps the
// consumer role (see kda_fwd_traits.cuh for the shape).
#pragma once

#include "kda_fwd_consumer.cuh"
#include "kda_fwd_producer.cuh"
#include "kda_fwd_scheduler.cuh"
#include "kda_fwd_traits.cuh"

namespace flash_kda::cuda::sm90 {

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
    KdaProducer<Tr, kSoftplus>(args, work, sm.group[group], group, threadIdx.x % Tr::kGroupThreads).run(sm.stage);
  } else {
    const RowsIO io = whole_sequence_rows<Tr::kDim>(args, work, Tr::kVRows);
    KdaConsumer<Tr, Fp32StageView<Tr>>(args, work, io, sm, warp - Tr::kProducerWarps, threadIdx.x & 31).run();
  }
}

// Host-side launcher of one instantiation (head dimension kD; defined in kda_fwd_sm90.cu and
// kda_fwd64_sm90.cu).
template <int kD, int kConsumerWarps>
cudaError_t launch_kda_fwd(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream);

}  // namespace flash_kda::cuda::sm90
