// Tile scheduler of the sm90 forward: which (sequence, value head, state slice) a CTA owns, and
// the token range of that sequence, read on the device (no host read of cu_seqlens).
#pragma once

#include "kda_fwd_traits.cuh"

namespace flash_kda::cuda::sm90 {

struct WorkUnit {
  int seq;         // n: index into the state tensors
  int hv;          // value head
  int slice;       // which kVRows rows of the state
  int64_t row;     // batch row of the activations
  int64_t begin;   // first token (within the batch row)
  int64_t len;     // tokens in the sequence (0 for an empty one)
  int64_t slot;    // state slot: n, or state_indices[n] with a pool
  bool skip;       // padding sequence (pool slot < 0 or >= pool_size): the CTA does nothing
  bool zero_init;  // start from zeros instead of the slot (has_initial_state[n] == 0)
  // Virtual tokens before the first one (checkpoint_start[n] % 16 with checkpoints, else 0): chunk
  // c covers tokens [16c - shift, 16c + 16 - shift) of the sequence (docs/kernel.md, "The shifted
  // chunk grid"); a token index below 0 is treated like one past the end.
  int shift;
};

// Chunks of a sequence of `len` tokens on a grid shifted by `shift` (0 for an empty sequence).
__host__ __device__ __forceinline__ int64_t chunk_count(int64_t len, int shift) {
  return len > 0 ? (len + shift + kChunkTokens - 1) / kChunkTokens : 0;
}

// What one CTA's consumers do with their kVRows rows (row0 = the slice's first row within the D
// rows of the state).
struct RowsIO {
  const void* init;     // state to start from; nullptr: zeros, or the identity with `identity`
  void* dst;            // where the rows end; nullptr: nowhere
  int64_t init_offset;  // element offset of row row0 in init / dst
  int64_t dst_offset;
  int row0;
  int warps;    // consumer warps that own rows, from the CTA's first (the others have no work)
  int chunk0;   // first chunk of the walk within the sequence
  int nchunks;  // chunks walked
  bool init_fp32, dst_fp32;
  bool identity;   // transition rows: start from I
  bool has_v;      // the delta rule's v enters (false for transition rows)
  bool write_out;  // the rows produce out
  // Checkpoints of the walk (rows that carry the real state, prepared plans): the state after walk
  // chunk ck_next goes to column ck_m of the sequence's checkpoint_indices row, then every ck_step
  // chunks to the next column, up to walk chunk ck_last. ck_next -1: none.
  int ck_next, ck_step, ck_last, ck_m;
};

// Element offset of row `row` of slot `slot`, head hv in a [*, HV, kD, kD] state tensor.
template <int kD>
__device__ __forceinline__ int64_t state_row_offset(int64_t slot, int heads_v, int hv, int row) {
  return ((slot * heads_v + hv) * kD + row) * kD;
}

// The fused kernel's rows: from initial_state (zeros without it or with has_initial_state == 0) to
// final_state over the whole sequence, writing out (head dimension kD).
template <int kD>
__device__ __forceinline__ RowsIO whole_sequence_rows(const KdaFwdArgs& a, const WorkUnit& w, int rows) {
  RowsIO io;
  io.row0 = w.slice * rows;
  io.warps = rows / 16;
  io.init = (a.initial_state != nullptr && !w.zero_init) ? a.initial_state : nullptr;
  io.dst = a.final_state;
  io.init_offset = io.dst_offset = state_row_offset<kD>(w.slot, a.heads_v, w.hv, io.row0);
  io.init_fp32 = a.initial_fp32;
  io.dst_fp32 = a.final_fp32;
  io.chunk0 = 0;
  io.nchunks = int(chunk_count(w.len, w.shift));
  io.identity = false;
  io.has_v = true;
  io.write_out = true;
  io.ck_next = io.ck_last = -1;  // the fused kernel writes no checkpoints
  io.ck_step = io.ck_m = 0;
  return io;
}

__device__ __forceinline__ int64_t load_cu_seqlen(const KdaFwdArgs& a, int i) {
  return a.cu_seqlens_i64 ? static_cast<const int64_t*>(a.cu_seqlens)[i]
                          : static_cast<int64_t>(static_cast<const int32_t*>(a.cu_seqlens)[i]);
}

// Token range [begin, begin + len) of sequence n. Offsets are clamped into [0, T] so that malformed
// cu_seqlens cannot cause out-of-bounds accesses; their contents are validated on the host by the
// Python layer (docs/api.md).
__device__ __forceinline__ void sequence_bounds(const KdaFwdArgs& a, int n, int64_t& begin, int64_t& len) {
  int64_t b = load_cu_seqlen(a, n), e = load_cu_seqlen(a, n + 1);
  b = b < 0 ? 0 : (b > a.seqlen ? a.seqlen : b);
  e = e < b ? b : (e > a.seqlen ? a.seqlen : e);
  begin = b;
  len = e - b;
}

// Packed batches of up to this many sequences are scheduled longest first.
constexpr int kSortMaxSeqs = 64;

// Heads and slices of one sequence are adjacent in launch order, so the CTAs sharing a sequence's
// q/k/g tiles run together and those tiles are read from L2 after the first CTA fetches them.
// In a packed batch the sequences are launched longest first (CTAs start roughly in launch order):
// a long sequence launched last would otherwise run alone at the end (~30% lost to
// imbalance). Every thread of the CTA must call this (it synchronises the CTA once).
__device__ __forceinline__ WorkUnit schedule_work(const KdaFwdArgs& a, int& scratch) {
  WorkUnit w;
  const int unit = blockIdx.x;
  w.slice = unit % a.slices;
  w.hv = (unit / a.slices) % a.heads_v;
  w.seq = unit / (a.slices * a.heads_v);
  if (a.cu_seqlens) {
    if (a.num_seqs > 1 && a.num_seqs <= kSortMaxSeqs) {
      // Thread i ranks sequence i (longer first, ties by index); the one ranked w.seq is ours.
      const int i = threadIdx.x;
      if (i < a.num_seqs) {
        int64_t b, len_i, len_j;
        sequence_bounds(a, i, b, len_i);
        int rank = 0;
        for (int j = 0; j < a.num_seqs; ++j) {
          sequence_bounds(a, j, b, len_j);
          rank += len_j > len_i || (len_j == len_i && j < i);
        }
        if (rank == w.seq) scratch = i;
      }
      __syncthreads();
      w.seq = scratch;
    }
    w.row = 0;
    sequence_bounds(a, w.seq, w.begin, w.len);
  } else {
    w.row = w.seq;
    w.begin = 0;
    w.len = a.seqlen;
  }
  // Pool indexing (docs/serving.md). Slot values cannot be checked on the host without a sync, so
  // one outside [0, pool_size) makes the sequence padding, like a negative one: nothing is written.
  w.slot = w.seq;
  w.skip = false;
  if (a.state_indices) {
    w.slot = a.state_indices[w.seq];
    w.skip = w.slot < 0 || w.slot >= a.pool_size;
  }
  w.zero_init = a.has_initial_state != nullptr && a.has_initial_state[w.seq] == 0;
  w.shift = 0;  // the fused kernel never runs with checkpoints
  return w;
}

}  // namespace flash_kda::cuda::sm90
