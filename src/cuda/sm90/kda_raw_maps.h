// Tensor maps of the raw q, k and g activations for the preparation pass (docs/kernel.md,
// "Preparation pass"): with them, one thread of a preparation CTA moves a chunk's three 16 x D bf16
// tiles into shared memory with three tensor copies, where without them the CTA's 128 threads issue
// 3 x 2 cp.async of 16 bytes each (and their address arithmetic) through the L1 pipe, which is what
// the pass is short of. Made on the host for every launch (a map holds the tensor's address); a
// layout the TMA engine cannot describe (a stride that is not a multiple of 16 bytes, an address not
// 16-byte aligned, more than 2^31 tokens) gets no maps, and the pass then loads by cp.async: the
// same bytes land in shared memory, so the results are identical either way.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kda_fwd_traits.cuh"

#ifndef FLASH_KDA_SIMT_EMULATION
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <mutex>
#endif

namespace flash_kda::cuda::sm90 {

// One map per tensor, each a rank-4 view (channel, head, token, batch row) with a box of one head's
// kChunkTokens x D elements: a chunk's tile lands as [token][channel], the layout of KdaRaw.
struct RawMaps {
  CUtensorMap q, k, g;
};

namespace raw_maps {

// The view of one activation: dims innermost first, strides of dims 1..3 in bytes.
struct View {
  const void* base;
  uint64_t dim[4];
  uint64_t stride[3];
};

inline bool describable(const View& v) {
  if (reinterpret_cast<uintptr_t>(v.base) % 16 != 0) return false;
  for (uint64_t d : v.dim)
    if (d == 0 || d > (uint64_t(1) << 31)) return false;  // (coordinates are int32)
  for (uint64_t s : v.stride)
    if (s % 16 != 0 || s >= (uint64_t(1) << 40)) return false;
  return true;
}

inline View view_of(const uint16_t* base, const int64_t (&s)[3], int64_t heads, int64_t tokens, int64_t rows, int kD) {
  // element strides (batch, token, head) -> bytes; a dimension of size 1 gets any valid stride
  auto bytes = [](int64_t elems, int64_t size) { return size == 1 ? uint64_t(16) : uint64_t(elems) * 2; };
  return View{base,
              {uint64_t(kD), uint64_t(heads), uint64_t(tokens), uint64_t(rows)},
              {bytes(s[2], heads), bytes(s[1], tokens), bytes(s[0], rows)}};
}

#ifdef FLASH_KDA_SIMT_EMULATION
inline bool encode(CUtensorMap& map, const View& v, int kD) {
  static_assert(sizeof(emu::EmuTensorMap) <= sizeof(CUtensorMap), "the emulated descriptor fits a CUtensorMap");
  emu::EmuTensorMap d{v.base, {v.dim[0], v.dim[1], v.dim[2], v.dim[3]}, {v.stride[0], v.stride[1], v.stride[2]},
                      {uint32_t(kD), 1, uint32_t(kChunkTokens), 1}};
  std::memcpy(&map, &d, sizeof d);
  return true;
}
#else
// cuTensorMapEncodeTiled through the runtime's driver entry point (no link to libcuda), looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    else
      cudaGetLastError();  // (not sticky; leave no error behind for the caller's next check)
  });
  return fn;
}

inline bool encode(CUtensorMap& map, const View& v, int kD) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dim[4] = {v.dim[0], v.dim[1], v.dim[2], v.dim[3]};
  const cuuint64_t stride[3] = {v.stride[0], v.stride[1], v.stride[2]};
  const cuuint32_t box[4] = {cuuint32_t(kD), 1, cuuint32_t(kChunkTokens), 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  return fn(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(v.base), dim, stride, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
#endif

}  // namespace raw_maps

// The maps of a's q, k and g (head dimension kD); false where one cannot be made (then the
// preparation loads by cp.async).
template <int kD>
bool make_raw_maps(const KdaFwdArgs& a, RawMaps& m) {
  const int64_t rows = a.cu_seqlens ? 1 : a.num_seqs, hq = a.heads_v / a.group;
  const raw_maps::View q = raw_maps::view_of(a.q, a.q_s, hq, a.seqlen, rows, kD);
  const raw_maps::View k = raw_maps::view_of(a.k, a.k_s, hq, a.seqlen, rows, kD);
  const raw_maps::View g = raw_maps::view_of(a.g, a.g_s, a.heads_v, a.seqlen, rows, kD);
  if (!raw_maps::describable(q) || !raw_maps::describable(k) || !raw_maps::describable(g)) return false;
  return raw_maps::encode(m.q, q, kD) && raw_maps::encode(m.k, k, kD) && raw_maps::encode(m.g, g, kD);
}

}  // namespace flash_kda::cuda::sm90
