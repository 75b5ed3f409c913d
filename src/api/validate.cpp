// Argument checking, shared by every backend: the one place where the contract of docs/spec.md is
// enforced (src/api/tensors.cpp adds what only tensor descriptions carry: extents, devices, the
// dtypes of the arrays). Runs before any backend touches memory; never reads device memory. The
// index arrays a host backend reads are copied here, once, and checked on the copy.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

namespace {

Status invalid(const std::string& msg) { return {StatusCode::kInvalidArgument, msg}; }
Status type_mismatch(const std::string& msg) { return {StatusCode::kTypeMismatch, msg}; }

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

#define FLASH_KDA_RETURN_IF_ERROR(expr) \
  do {                                  \
    Status s_ = (expr);                 \
    if (!s_.ok()) return s_;            \
  } while (0)

int64_t elem_bytes(DType d) {
  switch (d) {
    case DType::kBF16: return 2;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8:
    case DType::kBool: return 1;
    case DType::kNone: break;
  }
  return 1;
}

// Every alignment asked for is a power of two (2, 4, 8, 16, an element size): a mask, not a division.
bool aligned(const void* ptr, int64_t bytes) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr), b = uintptr_t(bytes);
  return (b & (b - 1)) == 0 ? (address & (b - 1)) == 0 : address % b == 0;
}

struct Tensor4 {
  const char* name;
  const void* ptr;
  ActStrides s;
  int64_t heads;
  int64_t dim;
};

Status check_activation(const ProblemParams& p, const Tensor4& t, bool data_free) {
  if (t.s.batch < 0 || t.s.token < 0 || t.s.head < 0)
    return invalid(cat(t.name, ": strides must be non-negative (got batch=", t.s.batch, ", token=", t.s.token,
                       ", head=", t.s.head, ")"));
  if (p.backend == Backend::kCuda &&
      ((p.batch > 1 && t.s.batch % 8 != 0) || t.s.token % 8 != 0 || (t.heads > 1 && t.s.head % 8 != 0)))
    return invalid(cat(t.name, ": strides must be multiples of 8 elements for the CUDA backend (got batch=", t.s.batch,
                       ", token=", t.s.token, ", head=", t.s.head, ")"));
  if (data_free) return Status::Ok();
  if (t.ptr == nullptr) return invalid(cat(t.name, ": null pointer"));
  // The CUDA kernels move 16-byte vectors of 8 bf16 values; the host reads bf16 values.
  const int64_t align = p.backend == Backend::kCuda ? 16 : 2;
  if (!aligned(t.ptr, align)) return invalid(cat(t.name, ": pointer must be ", align, "-byte aligned"));
  return Status::Ok();
}

// `out` is written, so distinct elements must not share an address.
Status check_no_self_overlap(const char* name, const ActStrides& s, int64_t B, int64_t T, int64_t heads, int64_t dim) {
  struct Dim {
    int64_t stride, extent;
  };
  Dim dims[4] = {{1, dim}, {s.head, heads}, {s.token, T}, {s.batch, B}};
  std::sort(dims, dims + 4, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t span = 1;  // elements covered by the dimensions so far
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (d.stride < span)
      return invalid(cat(name, ": strides make distinct elements overlap (batch=", s.batch, ", token=", s.token,
                         ", head=", s.head, ")"));
    span = d.stride * (d.extent - 1) + span;
  }
  return Status::Ok();
}

// ---- aliasing -------------------------------------------------------------------------------------

// The bytes [begin, end) a buffer of the call covers (every address an element of it can have).
// No default member initialisers: span_of sets every member, and the unused entries of Spans stay
// unwritten (a call fills a few of its 24).
struct Span {
  const char* name;
  uintptr_t begin, end;
  bool written;
};

Span span_of(const char* name, const void* ptr, int64_t bytes, bool written) {
  if (!ptr || bytes <= 0) return {name, 0, 0, written};
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  return {name, begin, begin + uintptr_t(bytes), written};
}

Span activation_span(const char* name, const void* ptr, const ActStrides& st, int64_t B, int64_t T, int64_t heads,
                     int64_t dim, bool written) {
  if (B == 0 || T == 0) return span_of(name, nullptr, 0, written);
  const int64_t last = (B - 1) * st.batch + (T - 1) * st.token + (heads - 1) * st.head + dim;
  return span_of(name, ptr, last * 2, written);
}

// No buffer the call writes may share a byte with any other buffer of the call, read or written
// (docs/spec.md, Aliasing); the one exception, final_state == initial_state, is left out by the
// caller. A written buffer that overlapped a read one would make the result depend on the order
// in which (sequence, head) tasks and CUDA blocks run, and an index array overwritten while the
// call runs could send it out of bounds.
// The spans of one call, on the stack: no allocation on the success path. A forward has at most 17
// buffers (the states, the ten of add_problem_spans, two index arrays, three of checkpoints), a
// decode 13.
struct Spans {
  static constexpr int kMaxSpans = 24;
  Span items[kMaxSpans];
  int count = 0;
  // An empty span (an absent buffer) overlaps nothing and check_aliasing passes over it: not kept.
  void push_back(const Span& s) {
    if (s.begin != s.end) items[count++] = s;
  }
};

Status check_aliasing(const Spans& all) {
  const Span* spans = all.items;
  const int n = all.count;
  for (int i = 0; i < n; ++i) {
    const Span& w = spans[i];
    if (!w.written || w.begin == w.end) continue;
    for (int j = 0; j < n; ++j) {
      const Span& o = spans[j];
      if (j == i || o.begin == o.end || (o.written && j < i)) continue;
      if (w.begin < o.end && o.begin < w.end)
        return invalid(cat(w.name, ": overlaps ", o.name, " (a buffer the call writes may share no memory with ",
                           "another argument; docs/spec.md, Aliasing)"));
    }
  }
  return Status::Ok();
}

void add_problem_spans(const ProblemParams& p, Spans& spans) {
  const int64_t HV = p.heads_v, K = p.head_dim_k, V = p.head_dim_v, B = p.batch, T = p.seqlen;
  spans.push_back(activation_span("out", p.out, p.out_strides, B, T, HV, V, true));
  spans.push_back(activation_span("q", p.q, p.q_strides, B, T, p.heads, K, false));
  spans.push_back(activation_span("k", p.k, p.k_strides, B, T, p.heads, K, false));
  spans.push_back(activation_span("v", p.v, p.v_strides, B, T, HV, V, false));
  spans.push_back(activation_span("g", p.g, p.g_strides, B, T, HV, K, false));
  spans.push_back(activation_span("beta", p.beta, p.beta_strides, B, T, HV, 1, false));
  spans.push_back(span_of("A_log", p.A_log, HV * 4, false));
  spans.push_back(span_of("dt_bias", p.dt_bias, HV * K * 4, false));
  if (p.cu_seqlens) {
    const int64_t bytes = (p.num_seqs + 1) * elem_bytes(p.cu_seqlens_dtype);
    spans.push_back(span_of("cu_seqlens", p.cu_seqlens, bytes, false));
    spans.push_back(span_of("cu_seqlens_cpu", p.cu_seqlens_cpu, bytes, false));
  }
}

// ---- index arrays -----------------------------------------------------------------------------------

void copy_offsets(const void* src, DType dtype, int64_t count, std::vector<int64_t>& dst) {
  dst.resize(size_t(count));
  if (dtype == DType::kI64) {
    const auto* cu = static_cast<const int64_t*>(src);
    std::copy(cu, cu + count, dst.begin());
  } else {
    const auto* cu = static_cast<const int32_t*>(src);
    std::copy(cu, cu + count, dst.begin());
  }
}

Status check_offsets(const std::vector<int64_t>& cu, int64_t total) {
  if (cu[0] != 0) return invalid(cat("cu_seqlens: must start at 0 (got ", cu[0], ")"));
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      return invalid(cat("cu_seqlens: must be non-decreasing (cu_seqlens[", i, "]=", cu[i], " < cu_seqlens[", i - 1,
                         "]=", cu[i - 1], ")"));
  if (cu.back() != total) return invalid(cat("cu_seqlens: must end at B*T=", total, " (got ", cu.back(), ")"));
  return Status::Ok();
}

// cu_seqlens of a host backend are copied into idx->cu and checked there; a host copy given as
// cu_seqlens_cpu is checked as well (for the CUDA backend it is the only copy the host can read; on
// the host it must equal cu_seqlens).
Status copy_and_check_offsets(const ProblemParams& p, HostIndices& idx) {
  if (!p.cu_seqlens) return Status::Ok();
  const int64_t count = p.num_seqs + 1;
  if (p.backend != Backend::kCuda) {
    copy_offsets(p.cu_seqlens, p.cu_seqlens_dtype, count, idx.cu);
    FLASH_KDA_RETURN_IF_ERROR(check_offsets(idx.cu, p.batch * p.seqlen));
  }
  if (p.cu_seqlens_cpu) {
    std::vector<int64_t> host;
    copy_offsets(p.cu_seqlens_cpu, p.cu_seqlens_dtype, count, host);
    FLASH_KDA_RETURN_IF_ERROR(check_offsets(host, p.batch * p.seqlen));
    if (p.backend == Backend::kCuda) {
      idx.cu = std::move(host);
    } else {
      for (int64_t i = 0; i < count; ++i)
        if (host[size_t(i)] != idx.cu[size_t(i)])
          return invalid(cat("cu_seqlens_cpu: differs from cu_seqlens at entry ", i, " (", host[size_t(i)],
                             " != ", idx.cu[size_t(i)], ")"));
    }
  }
  return Status::Ok();
}

// The contents of the slot indices, on the host copies: every slot a sequence uses lies in [0, P),
// the read column of speculative decoding lies in [0, S), a sequence has no more tokens than slots,
// and no slot is used by two sequences (their results would then depend on the order in which the
// sequences run, and on the GPU they would race).
Status check_slot_contents(const ProblemParams& p, const HostIndices& idx, int64_t P) {
  const int64_t N = num_sequences(p);
  const int64_t S = idx.slots_per_seq;
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, sequence)
  for (int64_t n = 0; n < N; ++n) {
    if (!idx.accepted.empty() && idx.accepted[size_t(n)] > S)
      return invalid(cat("num_accepted_tokens: entry ", n, " is ", idx.accepted[size_t(n)],
                         ", more than the slots per sequence (", S, ")"));
    const SeqSlots s = sequence_slots(idx, n);
    if (!s.active) continue;
    const SeqRange r = sequence_range(p, idx, n);
    const int64_t length = r.end - r.begin;
    if (s.per_token && length > S)
      return invalid(cat("state_indices: sequence ", n, " has ", length, " tokens but ", S,
                         " slots (speculative decoding writes one slot per token)"));
    auto use = [&](int64_t slot) -> Status {
      if (slot >= P)
        return invalid(cat("state_indices: slot ", slot, " of sequence ", n, " is outside the pool of ", P, " slots"));
      if (slot >= 0) used.emplace_back(slot, n);
      return Status::Ok();
    };
    for (int64_t slot : {s.read, s.write}) FLASH_KDA_RETURN_IF_ERROR(use(slot));
    if (s.per_token)
      for (int64_t t = 0; t < length; ++t) FLASH_KDA_RETURN_IF_ERROR(use(s.per_token[t]));
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i)
    if (used[i].first == used[i - 1].first && used[i].second != used[i - 1].second)
      return invalid(cat("state_indices: slot ", used[i].first, " is used by sequences ", used[i - 1].second, " and ",
                         used[i].second, " (active sequences need distinct slots)"));
  return Status::Ok();
}

Status check_index_pointer(const char* name, const void* ptr, bool data_free) {
  if (!data_free && !aligned(ptr, 4)) return invalid(cat(name, ": pointer must be 4-byte aligned"));
  return Status::Ok();
}

Status check_state_dtype(const char* name, DType d) {
  if (d != DType::kBF16 && d != DType::kF32)
    return type_mismatch(cat(name, ": dtype must be bf16 or fp32 (got ", dtype_name(d), ")"));
  return Status::Ok();
}

// The checkpoint arguments that need no memory contents (FwdParams::checkpoint_*): the interval,
// which pointers go with it, dtypes, sizes, alignment, and what a checkpoint pool that is one of the
// state pools must share with it. `slots` is the number of slots of initial_state / final_state.
Status check_checkpoint_args(const FwdParams& p, int64_t N, int64_t slots, bool data_free) {
  const bool on_cuda = p.backend == Backend::kCuda;
  if (p.checkpoint_interval < 0 || p.checkpoint_interval % 16 != 0)
    return invalid(cat("checkpoint_interval: must be a positive multiple of 16, or 0 for no checkpoints (got ",
                       p.checkpoint_interval, ")"));
  if (p.checkpoint_interval == 0) {
    for (auto [name, ptr] : {std::pair<const char*, const void*>{"checkpoint_state", p.checkpoint_state},
                             {"checkpoint_indices", p.checkpoint_indices},
                             {"checkpoint_start", p.checkpoint_start}})
      if (ptr) return invalid(cat(name, ": given without checkpoint_interval"));
    return Status::Ok();
  }
  if (!p.checkpoint_state) return invalid("checkpoint_state: null pointer (needed with checkpoint_interval)");
  FLASH_KDA_RETURN_IF_ERROR(check_state_dtype("checkpoint_state", p.checkpoint_state_dtype));
  if (p.checkpoint_pool_size < 0)
    return invalid(cat("checkpoint_pool_size: must be >= 0 (got ", p.checkpoint_pool_size, ")"));
  if (p.checkpoint_columns < 0)
    return invalid(cat("checkpoint_indices: number of columns must be >= 0 (got ", p.checkpoint_columns, ")"));
  if (p.checkpoint_indices_stride != 0 && p.checkpoint_indices_stride < p.checkpoint_columns)
    return invalid(cat("checkpoint_indices: row stride (", p.checkpoint_indices_stride,
                       ") must be 0 (contiguous) or >= the number of columns (", p.checkpoint_columns, ")"));
  if (!p.checkpoint_indices && N > 0 && p.checkpoint_columns > 0)
    return invalid("checkpoint_indices: null pointer (needed with checkpoint_interval)");
  if (p.checkpoint_start && p.checkpoint_start_dtype != DType::kI32 && p.checkpoint_start_dtype != DType::kI64)
    return type_mismatch(
        cat("checkpoint_start: dtype must be int32 or int64 (got ", dtype_name(p.checkpoint_start_dtype), ")"));
  FLASH_KDA_RETURN_IF_ERROR(check_index_pointer("checkpoint_indices", p.checkpoint_indices, data_free));
  if (!data_free) {
    const int64_t align = on_cuda ? 16 : elem_bytes(p.checkpoint_state_dtype);
    if (!aligned(p.checkpoint_state, align))
      return invalid(cat("checkpoint_state: pointer must be ", align, "-byte aligned"));
    if (p.checkpoint_start && !aligned(p.checkpoint_start, elem_bytes(p.checkpoint_start_dtype)))
      return invalid(cat("checkpoint_start: pointer must be ", elem_bytes(p.checkpoint_start_dtype), "-byte aligned"));
  }
  // The checkpoint pool may be a state pool itself: then it is that tensor, whole.
  for (auto [name, ptr, dtype] :
       {std::tuple<const char*, const void*, DType>{"initial_state", p.initial_state, p.initial_state_dtype},
        {"final_state", p.final_state, p.final_state_dtype}}) {
    if (data_free || ptr == nullptr || ptr != p.checkpoint_state) continue;
    if (dtype != p.checkpoint_state_dtype)
      return type_mismatch(cat("checkpoint_state: is ", name, " (the same buffer) but its dtype differs (",
                               dtype_name(p.checkpoint_state_dtype), " vs ", dtype_name(dtype), ")"));
    if (p.checkpoint_pool_size != slots)
      return invalid(cat("checkpoint_state: is ", name, " (the same buffer) but its number of slots differs (",
                         p.checkpoint_pool_size, " vs ", slots, ")"));
  }
  return Status::Ok();
}

// Copies checkpoint_start and checkpoint_indices into `idx` and checks the copies: starts in
// [0, 2^62), every slot in [-1, P2), the slots written (by active sequences, for boundaries they
// reach within the columns) distinct, and, when the checkpoint pool is a state pool, none of them
// a slot an active sequence reads or writes as its state there.
Status copy_and_check_checkpoints(const FwdParams& p, HostIndices& idx) {
  if (p.checkpoint_interval <= 0) return Status::Ok();
  const int64_t N = num_sequences(p), M = p.checkpoint_columns, P2 = p.checkpoint_pool_size;
  const int64_t row_stride = p.checkpoint_indices_stride > 0 ? p.checkpoint_indices_stride : M;
  idx.checkpoint_interval = p.checkpoint_interval;
  idx.checkpoint_columns = M;
  if (p.checkpoint_start) {
    copy_offsets(p.checkpoint_start, p.checkpoint_start_dtype, N, idx.checkpoint_start);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t s = idx.checkpoint_start[size_t(n)];
      if (s < 0 || s >= (int64_t(1) << 62))
        return invalid(cat("checkpoint_start: entry ", n, " is ", s, " (an absolute position, must be in [0, 2^62))"));
    }
  }
  idx.checkpoint_slots.resize(size_t(N * M));
  for (int64_t n = 0; n < N && M > 0; ++n)
    std::copy_n(p.checkpoint_indices + n * row_stride, M, idx.checkpoint_slots.begin() + n * M);
  for (int64_t i = 0; i < N * M; ++i) {
    const int32_t slot = idx.checkpoint_slots[size_t(i)];
    if (slot < -1 || slot >= P2)
      return invalid(cat("checkpoint_indices: entry [", i / M, ", ", i % M, "] is ", slot, ", outside [-1, ", P2,
                         ") (-1 skips a checkpoint; the pool has ", P2, " slots)"));
  }
  struct Use {
    int64_t slot, seq, column;  // column -1: the sequence's state slot
    bool operator<(const Use& o) const { return std::tie(slot, column, seq) < std::tie(o.slot, o.column, o.seq); }
  };
  std::vector<Use> uses;
  const bool is_initial = p.checkpoint_state == p.initial_state, is_final = p.checkpoint_state == p.final_state;
  for (int64_t n = 0; n < N; ++n) {
    const SeqSlots s = sequence_slots(idx, n);
    if (!s.active) continue;
    if (is_initial && s.read >= 0) uses.push_back({s.read, n, -1});
    if (is_final && s.write >= 0 && !(is_initial && s.write == s.read)) uses.push_back({s.write, n, -1});
    const SeqRange r = sequence_range(p, idx, n);
    const SeqCheckpoints c = sequence_checkpoints(idx, n, r.end - r.begin);
    for (int64_t m = 0; m < c.count; ++m)
      if (c.slots[m] >= 0) uses.push_back({c.slots[m], n, m});
  }
  std::sort(uses.begin(), uses.end());
  for (size_t i = 1; i < uses.size(); ++i) {
    const Use &a = uses[i - 1], &b = uses[i];
    if (a.slot != b.slot || b.column < 0) continue;
    if (a.column < 0)
      return invalid(cat("checkpoint_indices: slot ", b.slot, " (sequence ", b.seq, ", column ", b.column,
                         ") is the state slot of sequence ", a.seq, " in ",
                         is_initial ? "initial_state" : "final_state",
                         ", which checkpoint_state is (checkpoints must go to slots no sequence uses as its state)"));
    return invalid(cat("checkpoint_indices: slot ", b.slot, " is written twice (sequence ", a.seq, " column ", a.column,
                       ", sequence ", b.seq, " column ", b.column, "; written checkpoint slots must be distinct)"));
  }
  return Status::Ok();
}

// Sizes, scalars, activations, A_log / dt_bias and cu_seqlens: what the forward and decode share
// (`decode`: the call is a decode, which the messages name). `p` is normalised.
Status check_problem(const ProblemParams& p, bool data_free, bool decode) {
  const bool on_cuda = p.backend == Backend::kCuda;
  if (p.backend != Backend::kCuda && p.backend != Backend::kCpu && p.backend != Backend::kCpuReference)
    return invalid("backend: unknown value");

  // ---- sizes ----
  if (p.batch < 0) return invalid(cat("q: batch size must be >= 0 (got ", p.batch, ")"));
  if (p.seqlen < 0) return invalid(cat("q: sequence length must be >= 0 (got ", p.seqlen, ")"));
  if (p.heads < 1) return invalid(cat("q: number of heads must be >= 1 (got ", p.heads, ")"));
  const int64_t HV = p.heads_v;
  if (HV < 1) return invalid(cat("v: number of heads must be >= 1 (got ", HV, ")"));
  if (HV % p.heads != 0)
    return invalid(cat("v: number of value heads (", HV, ") must be a multiple of the q/k heads (", p.heads, ")"));
  if (p.head_dim_k < 1 || p.head_dim_k > 256)
    return invalid(cat("q: head dimension K must be in [1, 256] (got ", p.head_dim_k, ")"));
  if (p.head_dim_v < 1 || p.head_dim_v > 256)
    return invalid(cat("v: head dimension V must be in [1, 256] (got ", p.head_dim_v, ")"));
  // The CUDA kernels' head dimensions: K = V = 128 or K = V = 64, for the forward and the decode.
  if (on_cuda && !(p.head_dim_k == p.head_dim_v && (p.head_dim_k == 128 || p.head_dim_k == 64)))
    return {StatusCode::kUnsupported,
            cat("q: the CUDA ", decode ? "decode" : "forward",
                " supports K = V = 128 or K = V = 64 (got K=", p.head_dim_k, ", V=", p.head_dim_v, ")")};

  // ---- scalars ----
  if (!std::isfinite(p.scale)) return invalid("scale: must be finite");
  // ---- the gate's form (docs/spec.md, "Gate forms") ----
  if (p.gate != GateForm::kSigmoid && p.gate != GateForm::kSoftplus)
    return invalid(cat("gate: unknown GateForm value ", static_cast<int>(p.gate)));
  if (p.gate == GateForm::kSigmoid && !(p.lower_bound >= -5.0f && p.lower_bound < 0.0f))
    return invalid(cat("lower_bound: must satisfy -5 <= lower_bound < 0 (got ", p.lower_bound, ")"));

  // ---- activations ----
  if (p.batch > 0 && p.seqlen > 0) {
    const Tensor4 acts[] = {
        {"q", p.q, p.q_strides, p.heads, p.head_dim_k},  {"k", p.k, p.k_strides, p.heads, p.head_dim_k},
        {"v", p.v, p.v_strides, HV, p.head_dim_v},       {"g", p.g, p.g_strides, HV, p.head_dim_k},
        {"out", p.out, p.out_strides, HV, p.head_dim_v},
    };
    for (const Tensor4& t : acts) FLASH_KDA_RETURN_IF_ERROR(check_activation(p, t, data_free));
    if (p.beta_strides.batch < 0 || p.beta_strides.token < 0 || p.beta_strides.head < 0)
      return invalid("beta: strides must be non-negative");
    if (!data_free && p.beta == nullptr) return invalid("beta: null pointer");
    if (!data_free && !aligned(p.beta, 2)) return invalid("beta: pointer must be 2-byte aligned");
    FLASH_KDA_RETURN_IF_ERROR(check_no_self_overlap("out", p.out_strides, p.batch, p.seqlen, HV, p.head_dim_v));
  }
  if (!data_free) {
    // Only the sigmoid gate may go without A_log (a rate of 1); the softplus gate has no other scale.
    if (p.A_log == nullptr && p.gate == GateForm::kSoftplus)
      return invalid("A_log: null pointer (the softplus gate, GateForm::kSoftplus / lower_bound=None, needs A_log)");
    if (p.dt_bias == nullptr) return invalid("dt_bias: null pointer");
    if (p.A_log && !aligned(p.A_log, 4)) return invalid("A_log: pointer must be 4-byte aligned");
    if (!aligned(p.dt_bias, 4)) return invalid("dt_bias: pointer must be 4-byte aligned");
  }

  // ---- variable length ----
  if (p.cu_seqlens_cpu && !p.cu_seqlens) return invalid("cu_seqlens_cpu: given without cu_seqlens");
  if (p.cu_seqlens) {
    if (p.cu_seqlens_dtype != DType::kI64 && p.cu_seqlens_dtype != DType::kI32)
      return type_mismatch(cat("cu_seqlens: dtype must be int64 or int32 (got ", dtype_name(p.cu_seqlens_dtype), ")"));
    if (p.batch != 1) return invalid(cat("cu_seqlens: requires batch size 1 (got B=", p.batch, ")"));
    if (p.num_seqs < 0) return invalid(cat("cu_seqlens: number of sequences must be >= 0 (got ", p.num_seqs, ")"));
    if (p.cu_seqlens_dtype == DType::kI32 && p.seqlen > INT32_MAX)
      return invalid("cu_seqlens: int32 offsets cannot address more than 2^31-1 tokens");
    const int64_t align = elem_bytes(p.cu_seqlens_dtype);
    if (!data_free && !aligned(p.cu_seqlens, align))
      return invalid(cat("cu_seqlens: pointer must be ", align, "-byte aligned"));
    if (!data_free && p.cu_seqlens_cpu && !aligned(p.cu_seqlens_cpu, align))
      return invalid(cat("cu_seqlens_cpu: pointer must be ", align, "-byte aligned"));
  }
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
    case DType::kU8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "?";
}

int64_t num_sequences(const ProblemParams& p) { return p.cu_seqlens ? p.num_seqs : p.batch; }

void fill_contiguous_strides(ProblemParams& p) {
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

void normalise(ProblemParams& p) {
  fill_contiguous_strides(p);
  if (p.heads_v == 0) p.heads_v = p.heads;
}

void normalise(FwdParams& p) {
  normalise(static_cast<ProblemParams&>(p));
  if (p.initial_state_dtype == DType::kNone) p.initial_state_dtype = p.state_dtype;
  if (p.final_state_dtype == DType::kNone) p.final_state_dtype = p.state_dtype;
}

SeqRange sequence_range(const ProblemParams& p, const HostIndices& idx, int64_t n) {
  if (idx.cu.empty()) return {n, 0, p.seqlen};
  return {0, idx.cu[size_t(n)], idx.cu[size_t(n) + 1]};
}

SeqCheckpoints sequence_checkpoints(const HostIndices& idx, int64_t n, int64_t length) {
  SeqCheckpoints c;
  const int64_t I = idx.checkpoint_interval;
  if (I <= 0 || idx.checkpoint_columns == 0) return c;
  const int64_t start = idx.checkpoint_start.empty() ? 0 : idx.checkpoint_start[size_t(n)];
  c.interval = I;
  c.first = (start / I + 1) * I - start;
  if (length >= c.first) c.count = std::min((length - c.first) / I + 1, idx.checkpoint_columns);
  c.slots = idx.checkpoint_slots.data() + n * idx.checkpoint_columns;
  return c;
}

SeqSlots sequence_slots(const HostIndices& idx, int64_t n) {
  SeqSlots s;
  const int64_t S = idx.slots_per_seq;
  if (S > 1) {
    // Speculative: read the slot of the last accepted token, write one slot per token.
    const int32_t* row = idx.slots.data() + n * S;
    int64_t column = 0;
    if (!idx.accepted.empty()) {
      if (idx.accepted[size_t(n)] < 1) {
        s.active = false;
        return s;
      }
      column = idx.accepted[size_t(n)] - 1;
    }
    s.active = row[column] >= 0;
    if (s.active) {
      s.read = row[column];
      s.per_token = row;
    }
    return s;
  }
  const int64_t slot = idx.slots.empty() ? n : idx.slots[size_t(n)];
  s.active = slot >= 0;
  if (s.active) {
    s.read = !idx.has_initial.empty() && !idx.has_initial[size_t(n)] ? -1 : slot;
    s.write = slot;
  }
  return s;
}

Status check(const FwdParams& p, HostIndices* out_idx, bool data_free) {
  const bool on_cuda = p.backend == Backend::kCuda;
  FLASH_KDA_RETURN_IF_ERROR(check_problem(p, data_free, false));
  const int64_t HV = p.heads_v, N = num_sequences(p);

  // ---- states ----
  const bool same_state = p.initial_state != nullptr && p.initial_state == p.final_state;
  if (p.initial_state) FLASH_KDA_RETURN_IF_ERROR(check_state_dtype("initial_state", p.initial_state_dtype));
  if (p.final_state) FLASH_KDA_RETURN_IF_ERROR(check_state_dtype("final_state", p.final_state_dtype));
  if (same_state && p.initial_state_dtype != p.final_state_dtype)
    return type_mismatch(cat("final_state: dtype must match initial_state's when it is the same tensor (",
                             dtype_name(p.initial_state_dtype), ", got ", dtype_name(p.final_state_dtype), ")"));
  const int64_t slots = p.state_indices ? std::max<int64_t>(p.pool_size, 0) : N;
  const int64_t per_slot = HV * p.head_dim_v * p.head_dim_k;
  if (!data_free) {
    for (auto [name, ptr, dtype] :
         {std::tuple<const char*, const void*, DType>{"initial_state", p.initial_state, p.initial_state_dtype},
          {"final_state", p.final_state, p.final_state_dtype}}) {
      const int64_t align = on_cuda ? 16 : elem_bytes(dtype);
      if (ptr && !aligned(ptr, align)) return invalid(cat(name, ": pointer must be ", align, "-byte aligned"));
    }
  }

  // ---- state pool ----
  if (p.state_indices) {
    if (!p.initial_state && !p.final_state)
      return invalid("state_indices: needs initial_state or final_state (the pool)");
    if (p.pool_size < 0) return invalid(cat("pool_size: must be >= 0 (got ", p.pool_size, ")"));
    FLASH_KDA_RETURN_IF_ERROR(check_index_pointer("state_indices", p.state_indices, data_free));
  }
  if (p.has_initial_state && !p.initial_state) return invalid("has_initial_state: needs initial_state");

  // ---- plan ----
  if (static_cast<int>(p.plan) < static_cast<int>(FwdPlan::kAuto) ||
      static_cast<int>(p.plan) > static_cast<int>(FwdPlan::kSplit))
    return invalid(cat("plan: unknown value ", static_cast<int>(p.plan)));
  if (p.segment_chunks < 0) return invalid(cat("segment_chunks: must be >= 0 (got ", p.segment_chunks, ")"));
  if (p.walk_tokens != 0 && p.walk_tokens != 16 && p.walk_tokens != 32)
    return invalid(cat("walk_tokens: must be 0, 16 or 32 (got ", p.walk_tokens, ")"));
  FLASH_KDA_RETURN_IF_ERROR(check_checkpoint_args(p, N, slots, data_free));
  if (data_free) return Status::Ok();

  // ---- cu_seqlens contents first: copied once, checked on the copy (only read, so it is safe even
  // if cu_seqlens aliases an output, which the aliasing check then rejects) ----
  HostIndices local;
  HostIndices& idx = out_idx ? *out_idx : local;
  FLASH_KDA_RETURN_IF_ERROR(copy_and_check_offsets(p, idx));

  // ---- aliasing ----
  Spans spans;
  spans.push_back(span_of("final_state", p.final_state, slots * per_slot * elem_bytes(p.final_state_dtype), true));
  if (!same_state)
    spans.push_back(
        span_of("initial_state", p.initial_state, slots * per_slot * elem_bytes(p.initial_state_dtype), false));
  add_problem_spans(p, spans);
  spans.push_back(span_of("state_indices", p.state_indices, N * 4, false));
  spans.push_back(span_of("has_initial_state", p.has_initial_state, N, false));
  if (p.checkpoint_interval > 0) {
    // A checkpoint pool that is a state pool is that tensor (its slots are checked below).
    if (p.checkpoint_state != p.initial_state && p.checkpoint_state != p.final_state)
      spans.push_back(span_of("checkpoint_state", p.checkpoint_state,
                              p.checkpoint_pool_size * per_slot * elem_bytes(p.checkpoint_state_dtype), true));
    const int64_t M = p.checkpoint_columns;
    const int64_t row_stride = p.checkpoint_indices_stride > 0 ? p.checkpoint_indices_stride : M;
    spans.push_back(span_of("checkpoint_indices", p.checkpoint_indices,
                            N > 0 && M > 0 ? ((N - 1) * row_stride + M) * 4 : 0, false));
    if (p.checkpoint_start)
      spans.push_back(span_of("checkpoint_start", p.checkpoint_start, N * elem_bytes(p.checkpoint_start_dtype), false));
  }
  FLASH_KDA_RETURN_IF_ERROR(check_aliasing(spans));

  // ---- workspace ----
  const size_t ws = workspace_size(p);
  if (ws > 0 && (p.workspace == nullptr || p.workspace_bytes < ws))
    return invalid(cat("workspace: needs ", ws, " bytes (got ", p.workspace_bytes, ")"));

  // ---- slot contents: copied once, checked on the copy ----
  if (!on_cuda) {
    if (p.state_indices) idx.slots.assign(p.state_indices, p.state_indices + N);
    if (p.has_initial_state) idx.has_initial.assign(p.has_initial_state, p.has_initial_state + N);
    if (p.state_indices) FLASH_KDA_RETURN_IF_ERROR(check_slot_contents(p, idx, p.pool_size));
    FLASH_KDA_RETURN_IF_ERROR(copy_and_check_checkpoints(p, idx));
  }
  return Status::Ok();
}

Status check(const DecodeParams& p, HostIndices* out_idx, bool data_free) {
  const bool on_cuda = p.backend == Backend::kCuda;
  FLASH_KDA_RETURN_IF_ERROR(check_problem(p, data_free, true));
  if (!p.cu_seqlens && p.seqlen > kMaxDecodeTokens)
    return invalid(cat("q: decode takes at most ", kMaxDecodeTokens, " tokens per sequence (got T=", p.seqlen,
                       "); use fwd for longer sequences"));
  const int64_t N = num_sequences(p), HV = p.heads_v;

  // ---- the pool ----
  if (!data_free && p.state == nullptr) return invalid("state: null pointer");
  FLASH_KDA_RETURN_IF_ERROR(check_state_dtype("state", p.state_dtype));
  const int64_t align = on_cuda ? 16 : elem_bytes(p.state_dtype);
  if (!data_free && !aligned(p.state, align)) return invalid(cat("state: pointer must be ", align, "-byte aligned"));
  if (p.pool_size < 0) return invalid(cat("pool_size: must be >= 0 (got ", p.pool_size, ")"));

  // ---- slot indices ----
  if (!data_free && p.state_indices == nullptr) return invalid("state_indices: null pointer");
  FLASH_KDA_RETURN_IF_ERROR(check_index_pointer("state_indices", p.state_indices, data_free));
  if (p.slots_per_seq < 1 || p.slots_per_seq > kMaxDecodeTokens)
    return invalid(
        cat("state_indices: slots per sequence must be in [1, ", kMaxDecodeTokens, "] (got ", p.slots_per_seq, ")"));
  if (p.state_indices_stride != 0 && p.state_indices_stride < p.slots_per_seq)
    return invalid(cat("state_indices: row stride (", p.state_indices_stride,
                       ") must be 0 (contiguous) or >= ", "slots_per_seq (", p.slots_per_seq, ")"));
  if (p.slots_per_seq > 1 && !p.cu_seqlens && p.seqlen > p.slots_per_seq)
    return invalid(cat("state_indices: speculative decoding writes one slot per token: slots_per_seq (",
                       p.slots_per_seq, ") must be >= T (", p.seqlen, ")"));
  if (p.num_accepted_tokens) {
    if (p.slots_per_seq < 2) return invalid("num_accepted_tokens: needs speculative state_indices (slots_per_seq > 1)");
    FLASH_KDA_RETURN_IF_ERROR(check_index_pointer("num_accepted_tokens", p.num_accepted_tokens, data_free));
  }
  if (data_free) return Status::Ok();

  // ---- cu_seqlens contents first (copied once, only read) ----
  HostIndices local;
  HostIndices& idx = out_idx ? *out_idx : local;
  FLASH_KDA_RETURN_IF_ERROR(copy_and_check_offsets(p, idx));
  if (!idx.cu.empty()) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t length = idx.cu[size_t(n) + 1] - idx.cu[size_t(n)];
      if (length > kMaxDecodeTokens)
        return invalid(cat("cu_seqlens: sequence ", n, " has ", length, " tokens; decode takes at most ",
                           kMaxDecodeTokens, " (use fwd)"));
    }
  }

  // ---- aliasing: the pool is read and written in place; nothing else may overlap it or out ----
  const int64_t S = p.slots_per_seq;
  const int64_t row_stride = p.state_indices_stride > 0 ? p.state_indices_stride : S;
  Spans spans;
  add_problem_spans(p, spans);
  spans.push_back(
      span_of("state", p.state, p.pool_size * HV * p.head_dim_v * p.head_dim_k * elem_bytes(p.state_dtype), true));
  spans.push_back(span_of("state_indices", p.state_indices, N > 0 ? ((N - 1) * row_stride + S) * 4 : 0, false));
  spans.push_back(span_of("num_accepted_tokens", p.num_accepted_tokens, p.slots_per_seq > 1 ? N * 4 : 0, false));
  FLASH_KDA_RETURN_IF_ERROR(check_aliasing(spans));

  // ---- slot contents: copied once, checked on the copy ----
  if (!on_cuda) {
    idx.slots_per_seq = S;
    idx.slots.resize(size_t(N * S));
    for (int64_t n = 0; n < N; ++n) std::copy_n(p.state_indices + n * row_stride, S, idx.slots.begin() + n * S);
    if (S > 1 && p.num_accepted_tokens) idx.accepted.assign(p.num_accepted_tokens, p.num_accepted_tokens + N);
    FLASH_KDA_RETURN_IF_ERROR(check_slot_contents(p, idx, p.pool_size));
  }
  return Status::Ok();
}

Status validate(const FwdParams& params) {
  FwdParams p = params;
  normalise(p);
  return check(p, nullptr);
}

Status validate(const DecodeParams& params) {
  DecodeParams p = params;
  normalise(p);
  return check(p, nullptr);
}

}  // namespace flash_kda
