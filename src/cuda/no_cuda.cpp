// Built instead of the CUDA sources when the project is configured without CUDA
// (FLASH_KDA_ENABLE_CUDA=OFF): the CUDA backend then reports itself unavailable.
#include "../api/backends.h"

namespace flash_kda::cuda {

size_t workspace_size(const FwdParams&) { return 0; }

Status fwd(const FwdParams&, cudaStream_t) {
  return {StatusCode::kUnsupported, "backend: this build of flash-kda has no CUDA backend"};
}

Status decode(const DecodeParams&, cudaStream_t) {
  return {StatusCode::kUnsupported, "backend: this build of flash-kda has no CUDA backend"};
}

Status zero_bytes(void*, size_t, cudaStream_t) {
  return {StatusCode::kUnsupported, "backend: this build of flash-kda has no CUDA backend"};
}

Status fill_identity(float*, int64_t, int64_t, cudaStream_t) {
  return {StatusCode::kUnsupported, "backend: this build of flash-kda has no CUDA backend"};
}

Status compose(const ComposeParams&, cudaStream_t) {
  return {StatusCode::kUnsupported, "backend: this build of flash-kda has no CUDA backend"};
}

bool available() { return false; }

}  // namespace flash_kda::cuda
