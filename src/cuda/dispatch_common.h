// Shared by the CUDA dispatchers (fwd_dispatch.cu, decode_dispatch.cu): the current device's
// Hopper check, CUDA error statuses and stride copies.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "flash_kda/flash_kda.h"

namespace flash_kda::cuda {

inline Status cuda_error(const char* what, cudaError_t e) {
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e)};
}

// SM count of `device` if it is an sm_90 GPU, else 0. Attributes are read once per device; later
// calls cost an atomic load (the inline function's statics are shared by every translation unit).
inline cudaError_t sm90_sm_count(int device, int* sm_count) {
  constexpr int kMaxDevices = 64;
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

// The SM count of the current device, or an error status when there is none or it is not sm_90.
inline Status current_sm90_device(int* sm_count) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cuda_error("backend: no CUDA device", e);
  e = sm90_sm_count(device, sm_count);
  if (e != cudaSuccess) return cuda_error("backend: reading device attributes", e);
  if (*sm_count == 0) return {StatusCode::kUnsupported, "backend: the CUDA kernels need an sm_90 (Hopper) GPU"};
  return Status::Ok();
}

// Raises the dynamic shared-memory limit of kKernel on the current device, once per device (the
// attribute belongs to the device's context: a second GPU needs its own call), and with
// max_carveout also asks for the largest shared-memory carveout (where several CTAs of a large
// footprint must share an SM). Not a stream operation, so it is harmless inside graph capture;
// after the first call on a device it costs an atomic load.
template <auto kKernel>
cudaError_t raise_smem_limit(int bytes, bool max_carveout = false) {
  static std::atomic<uint64_t> done{0};  // bit d: set on device d (devices >= 64 always call)
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && max_carveout)
    e = cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_release);
  return e;
}

inline void copy_strides(int64_t (&dst)[3], const ActStrides& s) {
  dst[0] = s.batch;
  dst[1] = s.token;
  dst[2] = s.head;
}

// Copies the activation pointers, gate parameters and element strides every kernel argument block
// shares (KdaFwdArgs, KdaDecodeArgs) from the validated parameters.
template <class Args, class Params>
void copy_activations(Args& a, const Params& p) {
  a.q = static_cast<const uint16_t*>(p.q);
  a.k = static_cast<const uint16_t*>(p.k);
  a.v = static_cast<const uint16_t*>(p.v);
  a.g = static_cast<const uint16_t*>(p.g);
  a.beta = static_cast<const uint16_t*>(p.beta);
  a.out = static_cast<uint16_t*>(p.out);
  a.A_log = p.A_log;
  a.dt_bias = p.dt_bias;
  a.cu_seqlens = p.cu_seqlens;
  copy_strides(a.q_s, p.q_strides);
  copy_strides(a.k_s, p.k_strides);
  copy_strides(a.v_s, p.v_strides);
  copy_strides(a.g_s, p.g_strides);
  copy_strides(a.out_s, p.out_strides);
  copy_strides(a.beta_s, p.beta_strides);
}

}  // namespace flash_kda::cuda
