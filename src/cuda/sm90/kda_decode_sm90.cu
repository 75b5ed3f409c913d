// Instantiations and launcher of the sm90 decode kernel. Its shared memory is dynamic: up to ~48 KB with
// one pass over a CTA's rows (a launch needs no function attribute and no host call besides the launch
// itself), ~50 KB with two (the attribute raised once a device).
#include "kda_decode_sm90.cuh"

namespace flash_kda::cuda::sm90 {

template <typename StateT, int kHeadDim, int kRowsPerThread, int kRowPasses, bool kMatrix>
cudaError_t launch_kda_decode(const KdaDecodeArgs& args, int64_t units, cudaStream_t stream) {
  using Tr = KdaDecodeTraits<StateT, kHeadDim, kRowsPerThread, kRowPasses, kMatrix>;
  constexpr int kSmem = int(sizeof(KdaDecodeSmem<Tr>));
  if constexpr (kSmem > 48 * 1024) {
    // (the largest carveout: four such CTAs an SM)
    const cudaError_t e = raise_smem_limit<kda_decode_kernel<Tr>>(kSmem, true);
    if (e != cudaSuccess) return e;
  }
  kda_decode_kernel<Tr><<<dim3(static_cast<unsigned>(units)), Tr::kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

#define FLASH_KDA_DECODE_INSTANCE(S, D, R, P, M) \
  template cudaError_t launch_kda_decode<S, D, R, P, M>(const KdaDecodeArgs&, int64_t, cudaStream_t);
FLASH_KDA_DECODE_INSTANCE(float, 128, 1, 1, false)
FLASH_KDA_DECODE_INSTANCE(float, 128, 2, 1, false)
FLASH_KDA_DECODE_INSTANCE(float, 128, 4, 1, false)
FLASH_KDA_DECODE_INSTANCE(float, 128, 4, 1, true)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 1, 1, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 2, 1, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 1, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 1, true)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 2, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 128, 4, 2, true)
FLASH_KDA_DECODE_INSTANCE(float, 64, 1, 1, false)
FLASH_KDA_DECODE_INSTANCE(float, 64, 2, 1, false)
FLASH_KDA_DECODE_INSTANCE(float, 64, 4, 1, false)
FLASH_KDA_DECODE_INSTANCE(float, 64, 4, 1, true)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 1, 1, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 2, 1, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 4, 1, false)
FLASH_KDA_DECODE_INSTANCE(__nv_bfloat16, 64, 4, 1, true)
#undef FLASH_KDA_DECODE_INSTANCE

}  // namespace flash_kda::cuda::sm90
