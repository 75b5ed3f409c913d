// The decode entry point and the state-slot mapping shared by every backend: which slot of the pool
// a sequence reads its state from and which slots it writes (docs/serving.md).
#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

StateMap state_map(const FwdParams& p) {
  StateMap m;
  m.indices = p.state_indices;
  m.has_initial = p.has_initial_state;
  return m;
}

StateMap state_map(const DecodeParams& p) {
  StateMap m;
  m.indices = p.state_indices;
  m.slots_per_seq = p.slots_per_seq;
  m.stride = p.state_indices_stride > 0 ? p.state_indices_stride : p.slots_per_seq;
  m.num_accepted = p.slots_per_seq > 1 ? p.num_accepted_tokens : nullptr;
  return m;
}

FwdParams forward_view(const DecodeParams& d) {
  FwdParams p;
  p.batch = d.batch;
  p.seqlen = d.seqlen;
  p.heads = d.heads;
  p.heads_v = d.heads_v;
  p.head_dim_k = d.head_dim_k;
  p.head_dim_v = d.head_dim_v;
  p.q = d.q;
  p.k = d.k;
  p.v = d.v;
  p.g = d.g;
  p.beta = d.beta;
  p.A_log = d.A_log;
  p.dt_bias = d.dt_bias;
  p.scale = d.scale;
  p.lower_bound = d.lower_bound;
  p.out = d.out;
  p.q_strides = d.q_strides;
  p.k_strides = d.k_strides;
  p.v_strides = d.v_strides;
  p.g_strides = d.g_strides;
  p.out_strides = d.out_strides;
  p.beta_strides = d.beta_strides;
  p.initial_state = d.state;
  p.final_state = d.state;
  p.state_dtype = d.state_dtype;
  p.pool_size = d.pool_size;
  p.cu_seqlens = d.cu_seqlens;
  p.cu_seqlens_dtype = d.cu_seqlens_dtype;
  p.num_seqs = d.num_seqs;
  p.backend = d.backend;
  p.cpu_threads = d.cpu_threads;
  return p;
}

SeqSlots host_seq_slots(const StateMap& m, int64_t n) {
  SeqSlots s;
  if (m.slots_per_seq > 1) {
    // Speculative: read the slot of the last accepted token, write one slot per token.
    const int32_t* row = m.indices + n * m.stride;
    int64_t column = 0;
    if (m.num_accepted) {
      if (m.num_accepted[n] < 1) {
        s.active = false;
        return s;
      }
      column = m.num_accepted[n] - 1;
    }
    s.active = row[column] >= 0;
    if (s.active) {
      s.read = row[column];
      s.per_token = row;
    }
    return s;
  }
  const int64_t slot = m.indices ? m.indices[n * m.stride] : n;
  s.active = slot >= 0;
  if (s.active) {
    s.read = m.has_initial && !m.has_initial[n] ? -1 : slot;
    s.write = slot;
  }
  return s;
}

Status decode(const DecodeParams& params, cudaStream_t stream) {
  DecodeParams p = params;
  fill_contiguous_strides(p);
  Status s = validate(p);
  if (!s.ok()) return s;
  switch (p.backend) {
    case Backend::kCpuReference: return cpu::reference_fwd(forward_view(p), state_map(p));
    case Backend::kCpu: return cpu::recurrent_fwd(forward_view(p), state_map(p));
    case Backend::kCuda: return cuda::decode(p, stream);
  }
  return {StatusCode::kInvalidArgument, "backend: unknown value"};
}

}  // namespace flash_kda
