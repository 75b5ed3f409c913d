// Instantiations and launcher of the sm90 decode kernel. Its shared memory is dynamic: up to ~48 KB with
// one pass over a CTA's rows and one stage (a launch needs no function attribute and no host call
// besides the launch itself); two passes or two stages need more (the attribute raised once a device).
#include <atomic>

#include "kda_decode_sm90.cuh"

namespace flash_kda::cuda::sm90 {

template <typename StateT, int kHeadDim, int kRowsPerThread, int kRowPasses, int kStages>
cudaError_t launch_kda_decode(const KdaDecodeArgs& args, int64_t units, int sm_count, cudaStream_t stream) {
  using Tr = KdaDecodeTraits<StateT, kHeadDim, kRowsPerThread, kRowPasses, kStages>;
  constexpr int kSmem = int(sizeof(KdaDecodeSmem<Tr>));
  if constexpr (kSmem > 48 * 1024 || kStages > 1) {
    // (the largest carveout: as many such CTAs an SM as fit, which the streaming grid counts on)
    const cudaError_t e = raise_smem_limit<kda_decode_kernel<Tr>>(kSmem, true);
    if (e != cudaSuccess) return e;
  }
  int64_t grid = units;
  if constexpr (kStages > 1) {
    // CTAs an SM, asked once (every sm_90 device gives the same answer for the same kernel).
    static std::atomic<int> per_sm{0};
    int n = per_sm.load(std::memory_order_relaxed);
    if (n == 0) {
      const cudaError_t e =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kda_decode_kernel<Tr>, Tr::kThreads, size_t(kSmem));
      if (e != cudaSuccess) return e;
      per_sm.store(n, std::memory_order_relaxed);
    }
    grid = decode_stream_grid(units, n, sm_count);
  }
  kda_decode_kernel<Tr><<<dim3(static_cast<unsigned>(grid)), Tr::kThreads, kSmem, stream>>>(args, units);
  return cudaGetLastError();
}

#define FLASH_KDA_DECODE_INSTANCE(S, D, R, P, ST) \
  template cudaError_t launch_kda_decode<S, D, R, P, ST>(const KdaDecodeArgs&, int64_t, int, cudaStream_t);
FLASH_KDA_DECODE_INSTANCE(float, 128, 1, 1, 1)
FLASH_KDA_DECODE_INSTANCE(float, 128, 2, 1, 1)
FLASH_KDA_DECODE_INSTANCE(float, 128, 4, 1, 1)
FLASH_KDA_DECODE_INSTANCE(float, 128, 2, 1, 2)
FLASH_KDA_DECODE_INSTANCE(float, 128, 4, 1, 2)
FLASH_KDA_DECODE_INSTANCE(float, 128, 2, 1, 3)
FLASH_KDA_DECODE_INSTANCE(float, 128, 4, 1, 3)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 1, 1, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 2, 1, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 1, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 2, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 1, 2)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 1, 3)
FLASH_KDA_DECODE_INSTANCE(float, 64, 1, 1, 1)
FLASH_KDA_DECODE_INSTANCE(float, 64, 2, 1, 1)
FLASH_KDA_DECODE_INSTANCE(float, 64, 4, 1, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 1, 1, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 2, 1, 1)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 4, 1, 1)
#undef FLASH_KDA_DECODE_INSTANCE

}  // namespace flash_kda::cuda::sm90
