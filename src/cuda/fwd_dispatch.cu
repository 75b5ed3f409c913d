// CUDA backend entry: checks the device, picks the kernel shape for the problem and launches it.
// No allocation, no synchronisation, no host read of device memory: safe inside graph capture.
#include <atomic>
#include <string>

#include "../api/backends.h"
#include "sm90/kda_fwd_kernel.cuh"

namespace flash_kda::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int sm_count;
  bool is_sm90;
};

// Device attributes are read once per device; later calls cost an atomic load.
cudaError_t device_info(int device, DeviceInfo* info) {
  static std::atomic<int> cached[kMaxDevices];  // 0: unknown; else (sm_count << 1) | is_sm90
  if (device >= 0 && device < kMaxDevices) {
    const int c = cached[device].load(std::memory_order_relaxed);
    if (c != 0) {
      *info = {c >> 1, (c & 1) != 0};
      return cudaSuccess;
    }
  }
  int major = 0, minor = 0, sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  *info = {sms, major == 9 && minor == 0};
  if (device >= 0 && device < kMaxDevices) cached[device].store((sms << 1) | (info->is_sm90 ? 1 : 0));
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

}  // namespace

bool available() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return false;
  }
  DeviceInfo info{};
  return device_info(device, &info) == cudaSuccess && info.is_sm90;
}

size_t workspace_size(const FwdParams&) { return 0; }

Status fwd(const FwdParams& p, cudaStream_t stream) {
  // State pools in the prefill (docs/serving.md) run on the CPU backends only so far.
  if (p.state_indices)
    return {StatusCode::kUnsupported, "state_indices: the CUDA forward does not support state pools yet"};
  if (p.has_initial_state)
    return {StatusCode::kUnsupported, "has_initial_state: the CUDA forward does not support it yet"};

  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("backend: no CUDA device", e);
  DeviceInfo info{};
  e = device_info(device, &info);
  if (e != cudaSuccess) return cuda_error("backend: reading device attributes", e);
  if (!info.is_sm90)
    return {StatusCode::kUnsupported, "backend: the CUDA kernels need an sm_90 (Hopper) GPU"};

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0) return Status::Ok();

  sm90::KdaFwdArgs a{};
  a.q = static_cast<const uint16_t*>(p.q);
  a.k = static_cast<const uint16_t*>(p.k);
  a.v = static_cast<const uint16_t*>(p.v);
  a.g = static_cast<const uint16_t*>(p.g);
  a.beta = static_cast<const uint16_t*>(p.beta);
  a.out = static_cast<uint16_t*>(p.out);
  a.A_log = p.A_log;
  a.dt_bias = p.dt_bias;
  a.initial_state = p.initial_state;
  a.final_state = p.final_state;
  a.cu_seqlens = p.cu_seqlens;
  copy_strides(a.q_s, p.q_strides);
  copy_strides(a.k_s, p.k_strides);
  copy_strides(a.v_s, p.v_strides);
  copy_strides(a.g_s, p.g_strides);
  copy_strides(a.out_s, p.out_strides);
  copy_strides(a.beta_s, p.beta_strides);
  a.seqlen = p.seqlen;
  a.num_seqs = static_cast<int>(N);
  a.heads_v = static_cast<int>(HV);
  a.group = static_cast<int>(HV / p.heads);
  a.scale = p.scale;
  a.lower_bound_log2 = p.lower_bound * 1.4426950408889634f;
  a.state_fp32 = p.state_dtype == DType::kF32;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;

  // Split the 128 state rows over 1, 2, 4 or 8 CTAs: the rows evolve independently given k,
  // alpha and beta, so a slice only repeats the producer's preparation (its q/k/g reads hit L2).
  // More slices while the (sequence, head) pairs alone leave SMs idle; one CTA per SM.
  const int64_t pairs = N * HV;
  int slices = 1;
  while (slices < 8 && pairs * slices * 2 <= info.sm_count) slices *= 2;
  a.slices = slices;
  const int64_t units = pairs * slices;
  if (units > INT32_MAX) return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};

  switch (slices) {
    case 1: e = sm90::launch_kda_fwd<8>(a, units, stream); break;
    case 2: e = sm90::launch_kda_fwd<4>(a, units, stream); break;
    case 4: e = sm90::launch_kda_fwd<2>(a, units, stream); break;
    default: e = sm90::launch_kda_fwd<1>(a, units, stream); break;
  }
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

}  // namespace flash_kda::cuda
