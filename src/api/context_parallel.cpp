// The context-parallel pieces of the C++ API (flash_kda.h; docs/distributed.md): the transition of
// a shard and the composition of a shard's result with the state it starts from.
//
// transition() runs the forward itself: the rows of P evolve exactly like state rows with v = 0
// from the identity, so P is the forward's final state from an identity initial state with zero
// values (V = K), written in place into `transition`. The zero values are one [HV, K] row
// broadcast over the tokens (token and batch strides 0: only read); the forward's output, which
// nothing reads, goes to scratch memory (host: allocated here; CUDA: the caller's workspace).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {
namespace {

Status invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A message of the inner forward's checks speaks of its states, which are `transition`, and of its
// values and output, which live in the workspace (CUDA; on the host they are this call's own).
Status as_transition(Status s) {
  for (auto [name, as] : {std::pair<const char*, const char*>{"initial_state", "transition"},
                          {"final_state", "transition"}, {"out:", "workspace:"}, {"out ", "workspace "},
                          {"v:", "workspace:"}, {"v ", "workspace "}}) {
    const size_t len = std::strlen(name);
    if (s.message.compare(0, len, name) == 0) {
      s.message = as + s.message.substr(len);
      break;
    }
  }
  return s;
}

// The forward that computes the transition, normalised, without its value row and output yet.
FwdParams inner_forward(const TransitionParams& t) {
  FwdParams f;
  static_cast<ProblemParams&>(f) = t;
  const int64_t HV = t.heads_v > 0 ? t.heads_v : t.heads, K = t.head_dim_k;
  f.head_dim_v = K;
  f.v = nullptr;
  f.v_strides = {0, 0, K};  // one zero row per head, broadcast over the tokens
  f.out = nullptr;
  f.out_strides = {f.seqlen * HV * K, HV * K, K};
  f.initial_state = f.final_state = t.transition;
  f.state_dtype = DType::kF32;
  normalise(f);
  return f;
}

struct Scratch {
  size_t zero_bytes, out_bytes, fwd_bytes;
  size_t total() const { return align_up(zero_bytes) + align_up(out_bytes) + fwd_bytes + kAlign; }
};

Scratch scratch_of(const FwdParams& f) {
  Scratch s;
  s.zero_bytes = size_t(f.heads_v * f.head_dim_k) * 2;
  s.out_bytes = size_t(f.batch * f.seqlen * f.heads_v * f.head_dim_k) * 2;
  s.fwd_bytes = f.backend == Backend::kCuda ? workspace_size(f) : 0;
  return s;
}

}  // namespace

size_t transition_workspace_size(const TransitionParams& p) {
  if (p.backend != Backend::kCuda) return 0;
  const FwdParams f = inner_forward(p);
  if (!check(f, nullptr, /*data_free=*/true).ok()) return 0;  // transition() reports the error
  return scratch_of(f).total();
}

Status transition(const TransitionParams& params, cudaStream_t stream) {
  if (params.v != nullptr) return invalid("v: the transition takes no values (pass nullptr)");
  if (params.out != nullptr) return invalid("out: the transition writes no output (pass nullptr)");
  FwdParams f = inner_forward(params);
  // Sizes, strides, dtypes and the gate first (no pointer is needed), so that the scratch sizes
  // below are those of a valid problem.
  Status s = as_transition(check(f, nullptr, /*data_free=*/true));
  if (!s.ok()) return s;
  if (params.transition == nullptr) return invalid("transition: null pointer");
  const Scratch need = scratch_of(f);
  std::vector<uint16_t> host_zero, host_out;
  unsigned char* ws = nullptr;
  if (f.backend == Backend::kCuda) {
    if (params.workspace == nullptr || params.workspace_bytes < need.total())
      return invalid("workspace: the transition needs " + std::to_string(need.total()) + " bytes (got " +
                     std::to_string(params.workspace == nullptr ? 0 : params.workspace_bytes) +
                     "; transition_workspace_size)");
    const auto base = reinterpret_cast<uintptr_t>(params.workspace);
    ws = reinterpret_cast<unsigned char*>((base + kAlign - 1) / kAlign * kAlign);
    f.v = ws;
    f.out = ws + align_up(need.zero_bytes);
    f.workspace = ws + align_up(need.zero_bytes) + align_up(need.out_bytes);
    f.workspace_bytes = need.fwd_bytes;
  } else {
    host_zero.assign(need.zero_bytes / 2, 0);
    host_out.resize(need.out_bytes / 2);
    f.v = host_zero.data();
    f.out = host_out.data();
  }
  // Every check of the forward (pointers, alignment, aliasing of `transition` with the inputs, the
  // contents of cu_seqlens) before anything is written.
  s = as_transition(validate(f));
  if (!s.ok()) return s;
  const int64_t count = num_sequences(f) * f.heads_v, K = f.head_dim_k;
  if (f.backend == Backend::kCuda) {
    s = cuda::zero_bytes(ws, need.zero_bytes, stream);
    if (s.ok()) s = cuda::fill_identity(params.transition, count, K, stream);
    if (!s.ok()) return s;
  } else {
    std::fill_n(params.transition, count * K * K, 0.0f);
    for (int64_t m = 0; m < count; ++m)
      for (int64_t i = 0; i < K; ++i) params.transition[(m * K + i) * K + i] = 1.0f;
  }
  return as_transition(fwd(f, stream));
}

Status compose(const ComposeParams& p, cudaStream_t stream) {
  if (p.num_seqs < 0) return invalid("num_seqs: must be >= 0 (got " + std::to_string(p.num_seqs) + ")");
  if (p.heads_v < 1) return invalid("heads_v: must be >= 1 (got " + std::to_string(p.heads_v) + ")");
  if (p.head_dim_k < 1 || p.head_dim_k > 256 || p.head_dim_v < 1 || p.head_dim_v > 256)
    return invalid("head_dim_k: K and V must be in [1, 256] (got K=" + std::to_string(p.head_dim_k) +
                   ", V=" + std::to_string(p.head_dim_v) + ")");
  if (p.backend != Backend::kCuda && p.backend != Backend::kCpu && p.backend != Backend::kCpuReference)
    return invalid("backend: unknown value");
  if (p.transition == nullptr) return invalid("transition: null pointer");
  if (p.shard_state == nullptr) return invalid("shard_state: null pointer");
  if (p.state_out == nullptr) return invalid("state_out: null pointer");
  for (auto [name, ptr] : {std::pair<const char*, const void*>{"state_in", p.state_in}, {"transition", p.transition},
                           {"shard_state", p.shard_state}, {"state_out", p.state_out}})
    if (ptr != nullptr && reinterpret_cast<uintptr_t>(ptr) % 4 != 0)
      return invalid(std::string(name) + ": pointer must be 4-byte aligned");
  const size_t states = size_t(p.num_seqs * p.heads_v * p.head_dim_v * p.head_dim_k) * 4;
  const size_t trans = size_t(p.num_seqs * p.heads_v * p.head_dim_k * p.head_dim_k) * 4;
  if (states == 0) return Status::Ok();
  // state_out may be state_in or shard_state exactly; it may overlap nothing else.
  auto overlaps = [](const void* a, size_t na, const void* b, size_t nb) {
    const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return a != nullptr && b != nullptr && x < y + nb && y < x + na;
  };
  if (overlaps(p.state_out, states, p.transition, trans)) return invalid("state_out: overlaps transition");
  for (auto [name, ptr] : {std::pair<const char*, const void*>{"state_in", p.state_in}, {"shard_state", p.shard_state}})
    if (ptr != p.state_out && overlaps(p.state_out, states, ptr, states))
      return invalid(std::string("state_out: overlaps ") + name + " (only the same tensor is allowed)");
  if (p.backend == Backend::kCuda) return cuda::compose(p, stream);
  const int64_t mats = p.num_seqs * p.heads_v, V = p.head_dim_v, K = p.head_dim_k;
  std::vector<double> row(static_cast<size_t>(K));
  for (int64_t m = 0; m < mats; ++m) {
    const float* P = p.transition + m * K * K;
    for (int64_t r = 0; r < V; ++r) {
      const int64_t at = (m * V + r) * K;
      for (int64_t c = 0; c < K; ++c) row[size_t(c)] = p.shard_state[at + c];
      if (p.state_in != nullptr)
        for (int64_t j = 0; j < K; ++j) {
          const double s = p.state_in[at + j];
          for (int64_t c = 0; c < K; ++c) row[size_t(c)] += s * P[j * K + c];
        }
      for (int64_t c = 0; c < K; ++c) p.state_out[at + c] = float(row[size_t(c)]);
    }
  }
  return Status::Ok();
}

}  // namespace flash_kda
