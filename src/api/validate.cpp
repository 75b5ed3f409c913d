// Argument checking, shared by every backend: the one place where the contract of docs/spec.md is
// enforced. Runs before any backend touches memory; never reads device memory.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

namespace {

Status invalid(const std::string& msg) { return {StatusCode::kInvalidArgument, msg}; }

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

struct Tensor4 {
  const char* name;
  const void* ptr;
  ActStrides s;
  int64_t heads;
  int64_t dim;
};

Status check_activation(const FwdParams& p, const Tensor4& t, bool vector_aligned) {
  if (t.ptr == nullptr) return invalid(cat(t.name, ": null pointer"));
  if (t.s.batch < 0 || t.s.token < 0 || t.s.head < 0)
    return invalid(cat(t.name, ": strides must be non-negative (got batch=", t.s.batch,
                       ", token=", t.s.token, ", head=", t.s.head, ")"));
  if (vector_aligned) {
    // The CUDA kernels move 16-byte vectors of 8 bf16 values.
    if (reinterpret_cast<uintptr_t>(t.ptr) % 16 != 0)
      return invalid(cat(t.name, ": pointer must be 16-byte aligned for the CUDA backend"));
    if ((p.batch > 1 && t.s.batch % 8 != 0) || t.s.token % 8 != 0 || (t.heads > 1 && t.s.head % 8 != 0))
      return invalid(cat(t.name, ": strides must be multiples of 8 elements for the CUDA backend (got batch=",
                         t.s.batch, ", token=", t.s.token, ", head=", t.s.head, ")"));
  }
  return Status::Ok();
}

// `out` is written, so distinct elements must not share an address.
Status check_no_self_overlap(const char* name, const ActStrides& s, int64_t B, int64_t T,
                             int64_t heads, int64_t dim) {
  struct Dim {
    int64_t stride, extent;
  };
  Dim dims[4] = {{1, dim}, {s.head, heads}, {s.token, T}, {s.batch, B}};
  std::sort(dims, dims + 4, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t span = 1;  // elements covered by the dimensions so far
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (d.stride < span)
      return invalid(cat(name, ": strides make distinct elements overlap (batch=", s.batch,
                         ", token=", s.token, ", head=", s.head, ")"));
    span = d.stride * (d.extent - 1) + span;
  }
  return Status::Ok();
}

template <typename I>
Status check_cu_seqlens_contents(const I* cu, int64_t n, int64_t total) {
  if (cu[0] != 0) return invalid(cat("cu_seqlens: must start at 0 (got ", cu[0], ")"));
  for (int64_t i = 0; i < n; ++i)
    if (cu[i + 1] < cu[i])
      return invalid(cat("cu_seqlens: must be non-decreasing (cu_seqlens[", i + 1, "]=", cu[i + 1],
                         " < cu_seqlens[", i, "]=", cu[i], ")"));
  if (cu[n] != total)
    return invalid(cat("cu_seqlens: must end at B*T=", total, " (got ", cu[n], ")"));
  return Status::Ok();
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kNone: return "none";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "fp32";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
  }
  return "?";
}

int64_t num_sequences(const FwdParams& p) { return p.cu_seqlens ? p.num_seqs : p.batch; }
int64_t num_sequences(const DecodeParams& p) { return p.cu_seqlens ? p.num_seqs : p.batch; }

namespace {

template <typename Params>
void fill_strides(Params& p) {
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  auto fill = [&](ActStrides& s, int64_t heads, int64_t dim) {
    if (s.batch == 0 && s.token == 0 && s.head == 0) {
      s.head = dim;
      s.token = heads * dim;
      s.batch = p.seqlen * heads * dim;
    }
  };
  fill(p.q_strides, p.heads, p.head_dim_k);
  fill(p.k_strides, p.heads, p.head_dim_k);
  fill(p.v_strides, HV, p.head_dim_v);
  fill(p.g_strides, HV, p.head_dim_k);
  fill(p.out_strides, HV, p.head_dim_v);
  fill(p.beta_strides, HV, 1);
}

}  // namespace

void fill_contiguous_strides(FwdParams& p) { fill_strides(p); }
void fill_contiguous_strides(DecodeParams& p) { fill_strides(p); }

SeqRange host_sequence_range(const FwdParams& p, int64_t n) {
  if (!p.cu_seqlens) return {n, 0, p.seqlen};
  int64_t b, e;
  if (p.cu_seqlens_dtype == DType::kI64) {
    const auto* cu = static_cast<const int64_t*>(p.cu_seqlens);
    b = cu[n];
    e = cu[n + 1];
  } else {
    const auto* cu = static_cast<const int32_t*>(p.cu_seqlens);
    b = cu[n];
    e = cu[n + 1];
  }
  return {0, b, e};
}

namespace {

// Sizes, scalars, activations, A_log / dt_bias and cu_seqlens: what the forward and decode share.
// `p` has its strides filled.
Status check_problem(const FwdParams& p) {
  const bool on_cuda = p.backend == Backend::kCuda;
  if (p.backend != Backend::kCuda && p.backend != Backend::kCpu && p.backend != Backend::kCpuReference)
    return invalid("backend: unknown value");

  // ---- sizes ----
  if (p.batch < 0) return invalid(cat("q: batch size must be >= 0 (got ", p.batch, ")"));
  if (p.seqlen < 0) return invalid(cat("q: sequence length must be >= 0 (got ", p.seqlen, ")"));
  if (p.heads < 1) return invalid(cat("q: number of heads must be >= 1 (got ", p.heads, ")"));
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (p.heads_v < 0) return invalid(cat("v: number of heads must be >= 1 (got ", p.heads_v, ")"));
  if (HV % p.heads != 0)
    return invalid(cat("v: number of value heads (", HV, ") must be a multiple of the q/k heads (",
                       p.heads, ")"));
  if (p.head_dim_k < 1 || p.head_dim_k > 256)
    return invalid(cat("q: head dimension K must be in [1, 256] (got ", p.head_dim_k, ")"));
  if (p.head_dim_v < 1 || p.head_dim_v > 256)
    return invalid(cat("v: head dimension V must be in [1, 256] (got ", p.head_dim_v, ")"));
  if (on_cuda && (p.head_dim_k != 128 || p.head_dim_v != 128))
    return {StatusCode::kUnsupported,
            cat("q: the CUDA backend supports K = V = 128 (got K=", p.head_dim_k, ", V=", p.head_dim_v, ")")};

  // ---- scalars ----
  if (!std::isfinite(p.scale)) return invalid("scale: must be finite");
  if (!(p.lower_bound >= -5.0f && p.lower_bound < 0.0f))
    return invalid(cat("lower_bound: must satisfy -5 <= lower_bound < 0 (got ", p.lower_bound, ")"));

  // ---- activations ----
  const bool empty = p.batch == 0 || p.seqlen == 0;
  if (!empty) {
    const Tensor4 acts[] = {
        {"q", p.q, p.q_strides, p.heads, p.head_dim_k},   {"k", p.k, p.k_strides, p.heads, p.head_dim_k},
        {"v", p.v, p.v_strides, HV, p.head_dim_v},        {"g", p.g, p.g_strides, HV, p.head_dim_k},
        {"out", p.out, p.out_strides, HV, p.head_dim_v},
    };
    for (const Tensor4& t : acts) {
      Status s = check_activation(p, t, on_cuda);
      if (!s.ok()) return s;
    }
    Status s = check_activation(p, {"beta", p.beta, p.beta_strides, HV, 1}, false);
    if (!s.ok()) return s;
    s = check_no_self_overlap("out", p.out_strides, p.batch, p.seqlen, HV, p.head_dim_v);
    if (!s.ok()) return s;
  }
  if (p.A_log == nullptr) return invalid("A_log: null pointer");
  if (p.dt_bias == nullptr) return invalid("dt_bias: null pointer");

  // ---- variable length ----
  if (p.cu_seqlens) {
    if (p.cu_seqlens_dtype != DType::kI64 && p.cu_seqlens_dtype != DType::kI32)
      return {StatusCode::kTypeMismatch,
              cat("cu_seqlens: dtype must be int64 or int32 (got ", dtype_name(p.cu_seqlens_dtype), ")")};
    if (p.batch != 1)
      return invalid(cat("cu_seqlens: requires batch size 1 (got B=", p.batch, ")"));
    if (p.num_seqs < 0) return invalid(cat("cu_seqlens: number of sequences must be >= 0 (got ", p.num_seqs, ")"));
    if (!on_cuda) {
      Status s = p.cu_seqlens_dtype == DType::kI64
                     ? check_cu_seqlens_contents(static_cast<const int64_t*>(p.cu_seqlens), p.num_seqs, p.seqlen)
                     : check_cu_seqlens_contents(static_cast<const int32_t*>(p.cu_seqlens), p.num_seqs, p.seqlen);
      if (!s.ok()) return s;
    }
    if (p.cu_seqlens_dtype == DType::kI32 && p.seqlen > INT32_MAX)
      return invalid("cu_seqlens: int32 offsets cannot address more than 2^31-1 tokens");
  }
  return Status::Ok();
}

Status check_index_pointer(const char* name, const void* ptr) {
  if (reinterpret_cast<uintptr_t>(ptr) % alignof(int32_t) != 0)
    return invalid(cat(name, ": pointer must be 4-byte aligned"));
  return Status::Ok();
}

// The contents of the slot indices, read on the host (CPU backends only): every slot a sequence uses
// lies in [0, P), the read column of speculative decoding lies in [0, S), a sequence has no more
// tokens than slots, and no slot is used by two sequences (their results would then depend on the
// order in which the sequences run, and on the GPU they would race).
Status check_slot_contents(const FwdParams& view, const StateMap& m, int64_t P) {
  const int64_t N = num_sequences(view);
  const int64_t S = m.slots_per_seq;
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, sequence)
  for (int64_t n = 0; n < N; ++n) {
    if (m.num_accepted && m.num_accepted[n] > S)
      return invalid(cat("num_accepted_tokens: entry ", n, " is ", m.num_accepted[n],
                         ", more than the slots per sequence (", S, ")"));
    const SeqSlots s = host_seq_slots(m, n);
    if (!s.active) continue;
    const SeqRange r = host_sequence_range(view, n);
    const int64_t length = r.end - r.begin;
    if (s.per_token && length > S)
      return invalid(cat("state_indices: sequence ", n, " has ", length, " tokens but ", S,
                         " slots (speculative decoding writes one slot per token)"));
    auto use = [&](int64_t slot) -> Status {
      if (slot >= P)
        return invalid(cat("state_indices: slot ", slot, " of sequence ", n, " is outside the pool of ", P,
                           " slots"));
      if (slot >= 0) used.emplace_back(slot, n);
      return Status::Ok();
    };
    for (int64_t slot : {s.read, s.write}) {
      Status st = use(slot);
      if (!st.ok()) return st;
    }
    if (s.per_token) {
      for (int64_t t = 0; t < length; ++t) {
        Status st = use(s.per_token[t]);
        if (!st.ok()) return st;
      }
    }
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i)
    if (used[i].first == used[i - 1].first && used[i].second != used[i - 1].second)
      return invalid(cat("state_indices: slot ", used[i].first, " is used by sequences ", used[i - 1].second,
                         " and ", used[i].second, " (active sequences need distinct slots)"));
  return Status::Ok();
}

}  // namespace

Status validate(const FwdParams& params) {
  // All-zero strides mean "contiguous" (see ActStrides): check what fwd would run, not the zeros.
  FwdParams p = params;
  fill_contiguous_strides(p);
  const bool on_cuda = p.backend == Backend::kCuda;
  Status st = check_problem(p);
  if (!st.ok()) return st;
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  const int64_t N = num_sequences(p);

  // ---- state ----
  if (p.initial_state || p.final_state) {
    if (p.state_dtype != DType::kBF16 && p.state_dtype != DType::kF32)
      return {StatusCode::kTypeMismatch, cat(p.initial_state ? "initial_state" : "final_state",
                                             ": dtype must be bf16 or fp32 (got ", dtype_name(p.state_dtype), ")")};
    const size_t elem = p.state_dtype == DType::kF32 ? 4 : 2;
    const int64_t slots = p.state_indices ? std::max<int64_t>(p.pool_size, 0) : N;
    const int64_t bytes = slots * HV * p.head_dim_v * p.head_dim_k * int64_t(elem);
    const int64_t align = on_cuda ? 16 : int64_t(elem);
    for (auto [name, ptr] : {std::pair<const char*, const void*>{"initial_state", p.initial_state},
                             {"final_state", p.final_state}})
      if (ptr && reinterpret_cast<uintptr_t>(ptr) % align != 0)
        return invalid(cat(name, ": pointer must be ", align, "-byte aligned"));
    if (p.initial_state && p.final_state && p.initial_state != p.final_state) {
      const auto a = reinterpret_cast<uintptr_t>(p.initial_state);
      const auto b = reinterpret_cast<uintptr_t>(p.final_state);
      if (a < b + bytes && b < a + bytes)
        return invalid("final_state: must be the same tensor as initial_state or not overlap it");
    }
  }

  // ---- state pool ----
  if (p.state_indices) {
    if (!p.initial_state && !p.final_state)
      return invalid("state_indices: needs initial_state or final_state (the pool)");
    if (p.pool_size < 0) return invalid(cat("pool_size: must be >= 0 (got ", p.pool_size, ")"));
    st = check_index_pointer("state_indices", p.state_indices);
    if (!st.ok()) return st;
  }
  if (p.has_initial_state && !p.initial_state)
    return invalid("has_initial_state: needs initial_state");
  if (!on_cuda && p.state_indices) {
    st = check_slot_contents(p, state_map(p), p.pool_size);
    if (!st.ok()) return st;
  }

  // ---- plan ----
  if (static_cast<int>(p.plan) < static_cast<int>(FwdPlan::kAuto) ||
      static_cast<int>(p.plan) > static_cast<int>(FwdPlan::kSplit))
    return invalid(cat("plan: unknown value ", static_cast<int>(p.plan)));
  if (p.segment_chunks < 0) return invalid(cat("segment_chunks: must be >= 0 (got ", p.segment_chunks, ")"));

  // ---- workspace ----
  const size_t ws = workspace_size(p);
  if (ws > 0 && (p.workspace == nullptr || p.workspace_bytes < ws))
    return invalid(cat("workspace: needs ", ws, " bytes (got ", p.workspace_bytes, ")"));
  return Status::Ok();
}

Status validate(const DecodeParams& params) {
  DecodeParams d = params;
  fill_contiguous_strides(d);
  const FwdParams p = forward_view(d);
  const bool on_cuda = p.backend == Backend::kCuda;
  Status st = check_problem(p);
  if (!st.ok()) return st;
  if (!p.cu_seqlens && p.seqlen > kMaxDecodeTokens)
    return invalid(cat("q: decode takes at most ", kMaxDecodeTokens, " tokens per sequence (got T=", p.seqlen,
                       "); use fwd for longer sequences"));
  const int64_t N = num_sequences(p);
  if (p.cu_seqlens && !on_cuda) {
    for (int64_t n = 0; n < N; ++n) {
      const SeqRange r = host_sequence_range(p, n);
      if (r.end - r.begin > kMaxDecodeTokens)
        return invalid(cat("cu_seqlens: sequence ", n, " has ", r.end - r.begin,
                           " tokens; decode takes at most ", kMaxDecodeTokens, " (use fwd)"));
    }
  }

  // ---- the pool ----
  if (d.state == nullptr) return invalid("state: null pointer");
  if (d.state_dtype != DType::kBF16 && d.state_dtype != DType::kF32)
    return {StatusCode::kTypeMismatch,
            cat("state: dtype must be bf16 or fp32 (got ", dtype_name(d.state_dtype), ")")};
  const int64_t align = on_cuda ? 16 : (d.state_dtype == DType::kF32 ? 4 : 2);
  if (reinterpret_cast<uintptr_t>(d.state) % align != 0)
    return invalid(cat("state: pointer must be ", align, "-byte aligned"));
  if (d.pool_size < 0) return invalid(cat("pool_size: must be >= 0 (got ", d.pool_size, ")"));

  // ---- slot indices ----
  if (d.state_indices == nullptr) return invalid("state_indices: null pointer");
  st = check_index_pointer("state_indices", d.state_indices);
  if (!st.ok()) return st;
  if (d.slots_per_seq < 1 || d.slots_per_seq > kMaxDecodeTokens)
    return invalid(cat("state_indices: slots per sequence must be in [1, ", kMaxDecodeTokens, "] (got ",
                       d.slots_per_seq, ")"));
  if (d.state_indices_stride != 0 && d.state_indices_stride < d.slots_per_seq)
    return invalid(cat("state_indices: row stride (", d.state_indices_stride,
                       ") must be 0 (contiguous) or >= slots_per_seq (", d.slots_per_seq, ")"));
  if (d.slots_per_seq > 1 && !p.cu_seqlens && p.seqlen > d.slots_per_seq)
    return invalid(cat("state_indices: speculative decoding writes one slot per token: slots_per_seq (",
                       d.slots_per_seq, ") must be >= T (", p.seqlen, ")"));
  if (d.num_accepted_tokens) {
    if (d.slots_per_seq < 2)
      return invalid("num_accepted_tokens: needs speculative state_indices (slots_per_seq > 1)");
    st = check_index_pointer("num_accepted_tokens", d.num_accepted_tokens);
    if (!st.ok()) return st;
  }
  if (!on_cuda) {
    st = check_slot_contents(p, state_map(d), d.pool_size);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace flash_kda
