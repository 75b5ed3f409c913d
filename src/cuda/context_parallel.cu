// The CUDA side of the context-parallel pieces (flash_kda.h, docs/distributed.md): identity
// matrices for the transition (which runs as the forward from the identity with v = 0) and the
// composition state_in · transition + shard_state.
#include <cuda_runtime.h>

#include "../api/backends.h"
#include "dispatch_common.h"

namespace flash_kda::cuda {
namespace {

constexpr int kRows = 8;  // state rows one CTA composes

// count K x K identities, one thread an element (grid-stride).
__global__ void identity_kernel(float* dst, int64_t elements, int64_t K) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < elements; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % (K * K);
    dst[i] = e / K == e % K ? 1.f : 0.f;
  }
}

// One CTA: kRows rows of one (sequence, head) matrix; thread c computes column c (c < K) of those
// rows: out[r][c] = sum_j in[r][j] P[j][c] + R[r][c]. The rows of state_in are staged in shared
// memory before anything is written, so state_out may be state_in (each CTA reads and writes only
// its own rows); an element of shard_state is read by the thread that writes it, so state_out may
// be shard_state.
__global__ void compose_kernel(const float* state_in, const float* transition, const float* shard_state,
                               float* state_out, int64_t V, int64_t K) {
  extern __shared__ float rows[];  // [kRows][K]
  const int64_t row_blocks = (V + kRows - 1) / kRows;
  const int64_t mat = blockIdx.x / row_blocks, r0 = (blockIdx.x % row_blocks) * kRows;
  const int nr = int(min(int64_t(kRows), V - r0));
  const float* in = state_in != nullptr ? state_in + (mat * V + r0) * K : nullptr;
  const float* P = transition + mat * K * K;
  const float* R = shard_state + (mat * V + r0) * K;
  float* out = state_out + (mat * V + r0) * K;
  if (in != nullptr)
    for (int64_t i = threadIdx.x; i < nr * K; i += blockDim.x) rows[i] = in[i];
  __syncthreads();
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) {
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.f;
    if (in != nullptr) {
      for (int64_t j = 0; j < K; ++j) {
        const float p = P[j * K + c];  // coalesced over c
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = fmaf(rows[(r < nr ? r : 0) * K + j], p, acc[r]);
      }
    }
    for (int r = 0; r < nr; ++r) out[r * K + c] = acc[r] + R[r * K + c];
  }
}

}  // namespace

Status zero_bytes(void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  const cudaError_t e = cudaMemsetAsync(dst, 0, bytes, stream);
  return e == cudaSuccess ? Status::Ok() : cuda_error("transition: zeroing the values", e);
}

Status fill_identity(float* dst, int64_t count, int64_t K, cudaStream_t stream) {
  const int64_t elements = count * K * K;
  if (elements == 0) return Status::Ok();
  const int blocks = int(std::min<int64_t>((elements + 255) / 256, 4096));
  identity_kernel<<<blocks, 256, 0, stream>>>(dst, elements, K);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : cuda_error("transition: launching the identity fill", e);
}

Status compose(const ComposeParams& p, cudaStream_t stream) {
  const int64_t mats = p.num_seqs * p.heads_v;
  if (mats == 0 || p.head_dim_v == 0) return Status::Ok();
  const int64_t blocks = mats * ((p.head_dim_v + kRows - 1) / kRows);
  if (blocks > int64_t(INT32_MAX)) return {StatusCode::kUnsupported, "num_seqs: too many matrices for one launch"};
  const int threads = int(std::min<int64_t>(p.head_dim_k, 256));
  const size_t smem = size_t(kRows) * size_t(p.head_dim_k) * sizeof(float);
  compose_kernel<<<unsigned(blocks), threads, smem, stream>>>(p.state_in, p.transition, p.shard_state, p.state_out,
                                                              p.head_dim_v, p.head_dim_k);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : cuda_error("compose: launching the kernel", e);
}

}  // namespace flash_kda::cuda
