// CUDA backend of `decode`: checks the device, picks the kernel shape for the problem and launches
// it. No allocation, no synchronisation, no host read of device memory: safe inside graph capture.
#include <atomic>
#include <string>

#include "../api/backends.h"
#include "sm90/kda_decode_sm90.cuh"

namespace flash_kda::cuda {

namespace {

constexpr int kMaxDevices = 64;

// SM count of `device` if it is an sm_90 GPU, else 0; read once per device (an atomic load later).
cudaError_t sm90_sm_count(int device, int* sm_count) {
  static std::atomic<int> cached[kMaxDevices];  // 0: unknown; else sm_count + 1 (1: not sm_90)
  if (device >= 0 && device < kMaxDevices) {
    const int c = cached[device].load(std::memory_order_relaxed);
    if (c != 0) {
      *sm_count = c - 1;
      return cudaSuccess;
    }
  }
  int major = 0, minor = 0, sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  *sm_count = major == 9 && minor == 0 ? sms : 0;
  if (device >= 0 && device < kMaxDevices) cached[device].store(*sm_count + 1, std::memory_order_relaxed);
  return cudaSuccess;
}

Status cuda_error(const char* what, cudaError_t e) {
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e)};
}

void copy_strides(int64_t (&dst)[3], const ActStrides& s) {
  dst[0] = s.batch;
  dst[1] = s.token;
  dst[2] = s.head;
}

template <typename StateT>
cudaError_t launch(const sm90::KdaDecodeArgs& a, int64_t pairs, int rows_per_thread, cudaStream_t stream) {
  switch (rows_per_thread) {
    case 4: return sm90::launch_kda_decode<StateT, 4>(a, pairs * 2, stream);
    case 2: return sm90::launch_kda_decode<StateT, 2>(a, pairs * 4, stream);
    default: return sm90::launch_kda_decode<StateT, 1>(a, pairs * 8, stream);
  }
}

}  // namespace

Status decode(const DecodeParams& p, cudaStream_t stream) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("backend: no CUDA device", e);
  int sm_count = 0;
  e = sm90_sm_count(device, &sm_count);
  if (e != cudaSuccess) return cuda_error("backend: reading device attributes", e);
  if (sm_count == 0)
    return {StatusCode::kUnsupported, "backend: the CUDA kernels need an sm_90 (Hopper) GPU"};

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0 || p.seqlen == 0) return Status::Ok();

  sm90::KdaDecodeArgs a{};
  a.q = static_cast<const uint16_t*>(p.q);
  a.k = static_cast<const uint16_t*>(p.k);
  a.v = static_cast<const uint16_t*>(p.v);
  a.g = static_cast<const uint16_t*>(p.g);
  a.beta = static_cast<const uint16_t*>(p.beta);
  a.out = static_cast<uint16_t*>(p.out);
  a.A_log = p.A_log;
  a.dt_bias = p.dt_bias;
  a.state = p.state;
  a.state_indices = p.state_indices;
  a.num_accepted = p.slots_per_seq > 1 ? p.num_accepted_tokens : nullptr;
  a.cu_seqlens = p.cu_seqlens;
  copy_strides(a.q_s, p.q_strides);
  copy_strides(a.k_s, p.k_strides);
  copy_strides(a.v_s, p.v_strides);
  copy_strides(a.g_s, p.g_strides);
  copy_strides(a.out_s, p.out_strides);
  copy_strides(a.beta_s, p.beta_strides);
  a.seqlen = p.seqlen;
  a.pool_size = p.pool_size;
  a.slots_per_seq = static_cast<int>(p.slots_per_seq);
  a.indices_stride = p.state_indices_stride > 0 ? p.state_indices_stride : p.slots_per_seq;
  a.heads_v = static_cast<int>(HV);
  a.group = static_cast<int>(HV / p.heads);
  a.scale = p.scale;
  a.lower_bound = p.lower_bound;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;

  // Rows of S per thread: as many as keep at least ~4 CTAs per SM in the grid (4 rows: 2 CTAs per
  // (sequence, head), ~128 registers, 4 CTAs resident per SM); fewer rows per thread split a head
  // over more CTAs when the batch alone cannot fill the GPU (B=1, H=32: 32 heads × 8 slices).
  const int64_t pairs = N * HV;
  int rows_per_thread = 4;
  while (rows_per_thread > 1 && pairs * (8 / rows_per_thread) < 4 * int64_t(sm_count)) rows_per_thread /= 2;
  if (pairs * (8 / rows_per_thread) > INT32_MAX)
    return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};

  e = p.state_dtype == DType::kF32 ? launch<float>(a, pairs, rows_per_thread, stream)
                                   : launch<__nv_bfloat16>(a, pairs, rows_per_thread, stream);
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

}  // namespace flash_kda::cuda
