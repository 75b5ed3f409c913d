// Tensor descriptions -> FwdParams / DecodeParams (src/api/tensors.h): the checks that need a
// tensor's extents, dtype or device, in the order dtypes, shapes, strides, devices; every message
// starts with the argument's name.
#include "tensors.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <new>
#include <sstream>
#include <type_traits>

#include "backends.h"

namespace flash_kda {

namespace {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

Status invalid(const std::string& msg) { return {StatusCode::kInvalidArgument, msg}; }

#define FLASH_KDA_RETURN_IF_ERROR(expr) \
  do {                                  \
    Status s_ = (expr);                 \
    if (!s_.ok()) return s_;            \
  } while (0)

struct Named {
  const char* name;
  const TensorArg* t;
};

std::string dtype_text(const TensorArg& t) { return t.dtype_text.empty() ? dtype_name(t.dtype) : t.dtype_text; }

std::string shape_text(const TensorArg& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < std::min(t.ndim, kMaxTensorRank); ++i) os << (i ? ", " : "") << t.shape[i];
  if (t.ndim > kMaxTensorRank) os << ", ...";
  os << "]";
  return os.str();
}

std::string device_text(const TensorArg& t) {
  switch (t.device) {
    case Device::kHost: return "cpu";
    case Device::kCuda: return cat("cuda:", t.device_id);
    case Device::kMeta: return "meta";
    case Device::kOther: break;
  }
  return t.device_text.empty() ? "an unsupported device" : t.device_text;
}

int64_t numel(const TensorArg& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim && i < kMaxTensorRank; ++i) n *= t.shape[i];
  return n;
}

Status expect_dtype(const char* name, const TensorArg& t, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return Status::Ok();
  std::string want;
  for (DType d : allowed) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  return {StatusCode::kTypeMismatch, cat(name, ": dtype must be ", want, " (got ", dtype_text(t), ")")};
}

bool has_shape(const TensorArg& t, std::initializer_list<int64_t> shape) {
  if (t.ndim != int(shape.size())) return false;
  int i = 0;
  for (int64_t extent : shape)
    if (t.shape[i++] != extent) return false;
  return true;
}

// The expected shape's text is a string or a function returning one: it is only built for the
// message (a call that passes builds no strings: the eager route's host overhead, docs/torch.md).
inline std::string text_of(const char* t) { return t; }
inline const std::string& text_of(const std::string& t) { return t; }
template <class F, class = decltype(std::declval<F>()())>
std::string text_of(const F& f) {
  return f();
}

template <class Text>
Status expect_shape(const char* name, const TensorArg& t, std::initializer_list<int64_t> shape, const Text& text) {
  if (has_shape(t, shape)) return Status::Ok();
  return invalid(cat(name, ": expected shape ", text_of(text), " (got ", shape_text(t), ")"));
}

bool is_contiguous(const TensorArg& t) {
  if (numel(t) == 0) return true;  // no element has an address; frameworks report arbitrary strides
  int64_t expected = 1;
  for (int i = t.ndim; i-- > 0;) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

Status expect_contiguous(const char* name, const TensorArg& t) {
  if (is_contiguous(t)) return Status::Ok();
  std::ostringstream os;
  for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.strides[i];
  return invalid(cat(name, ": must be contiguous (got strides [", os.str(), "])"));
}

Status expect_no_negative_strides(const Named& a) {
  const TensorArg& t = *a.t;
  if (!t.given) return Status::Ok();
  for (int i = 0; i < t.ndim; ++i) {
    if (t.strides[i] >= 0) continue;
    if (numel(t) == 0) return Status::Ok();  // counted only here: most tensors have no negative stride
    return invalid(cat(a.name, ": negative strides are not supported"));
  }
  return Status::Ok();
}

// Strides of a [B, T, heads, D] activation (or [B, T, HV] for beta, has_dim false). The stride of a
// dimension of extent 1 never affects an address, so it is replaced by the value a contiguous tensor
// would have; the alignment checks of the CUDA backend then see only strides that matter.
Status activation_strides(const char* name, const TensorArg& t, bool has_dim, ActStrides* out) {
  *out = {};
  if (numel(t) == 0) return Status::Ok();  // never dereferenced: nothing is read when B*T == 0
  if (has_dim && t.shape[3] > 1 && t.strides[3] != 1)
    return invalid(cat(name, ": the last dimension must be contiguous (stride 1, got ", t.strides[3], ")"));
  int64_t inner = has_dim ? t.shape[3] : 1;  // elements spanned by the dimensions inside
  int64_t s[3];                              // batch, token, head
  for (int i = 3; i-- > 0;) {
    s[i] = t.shape[i] == 1 ? inner : t.strides[i];
    inner = s[i] * t.shape[i];
  }
  *out = {s[0], s[1], s[2]};
  // An all-zero triple means "contiguous" to the C++ API; only broadcast views produce one.
  if (numel(t) > 1 && out->batch == 0 && out->token == 0 && out->head == 0)
    return invalid(cat(name, ": broadcast (stride 0) views are not supported"));
  return Status::Ok();
}

float to_float(double x) {
  if (std::isfinite(x) && std::abs(x) > double(std::numeric_limits<float>::max()))
    return x > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  return float(x);
}

// The activations, gate parameters and cu_seqlens: everything fwd and decode share. Leaves the
// number of sequences in *N.
Status problem_params(const CallArgs& a, ProblemParams* p, int64_t* N) {
  const Named required[] = {{"q", &a.q},       {"k", &a.k},     {"v", &a.v},         {"g", &a.g},
                            {"beta", &a.beta}, {"out", &a.out}, {"A_log", &a.A_log}, {"dt_bias", &a.dt_bias}};
  for (const Named& t : required) {
    // A_log may be None with a lower_bound (the sigmoid gate at rate 1; docs/spec.md, "Gate forms").
    if (t.t == &a.A_log && a.has_lower_bound) continue;
    if (!t.t->given)
      return {StatusCode::kTypeMismatch,
              cat(t.name, ": expected an array (got None)",
                  t.t == &a.A_log ? "; the softplus gate (lower_bound=None) needs A_log" : "")};
  }

  // ---- dtypes ----
  for (Named t : {Named{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"g", &a.g}, {"beta", &a.beta}, {"out", &a.out}})
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype(t.name, *t.t, {DType::kBF16}));
  if (a.A_log.given) FLASH_KDA_RETURN_IF_ERROR(expect_dtype("A_log", a.A_log, {DType::kF32}));
  FLASH_KDA_RETURN_IF_ERROR(expect_dtype("dt_bias", a.dt_bias, {DType::kF32}));
  if (a.cu_seqlens.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("cu_seqlens", a.cu_seqlens, {DType::kI64, DType::kI32}));
  if (a.cu_seqlens_cpu.given) {
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("cu_seqlens_cpu", a.cu_seqlens_cpu, {DType::kI64, DType::kI32}));
    if (a.cu_seqlens.given && a.cu_seqlens_cpu.dtype != a.cu_seqlens.dtype)
      return {StatusCode::kTypeMismatch,
              cat("cu_seqlens_cpu: dtype must be that of cu_seqlens (", dtype_name(a.cu_seqlens.dtype), ", got ",
                  dtype_text(a.cu_seqlens_cpu), ")")};
  }

  // ---- shapes ----
  if (a.q.ndim != 4) return invalid(cat("q: expected shape [B, T, H, K] (got ", shape_text(a.q), ")"));
  const int64_t B = a.q.shape[0], T = a.q.shape[1], H = a.q.shape[2], K = a.q.shape[3];
  if (a.v.ndim != 4 || a.v.shape[0] != B || a.v.shape[1] != T)
    return invalid(cat("v: expected shape [B, T, HV, V] with B=", B, ", T=", T, " (got ", shape_text(a.v), ")"));
  const int64_t HV = a.v.shape[2], V = a.v.shape[3];
  if (H < 1) return invalid(cat("q: number of heads must be >= 1 (got H=", H, ")"));
  if (HV < 1) return invalid(cat("v: number of value heads must be >= 1 (got HV=", HV, ")"));
  if (HV % H != 0)
    return invalid(cat("v: number of value heads HV=", HV, " must be a multiple of the q/k heads H=", H));
  FLASH_KDA_RETURN_IF_ERROR(expect_shape("k", a.k, {B, T, H, K}, "[B, T, H, K] like q"));
  FLASH_KDA_RETURN_IF_ERROR(expect_shape("g", a.g, {B, T, HV, K},
                                         [&] { return cat("[B, T, HV, K] = [", B, ", ", T, ", ", HV, ", ", K, "]"); }));
  FLASH_KDA_RETURN_IF_ERROR(
      expect_shape("beta", a.beta, {B, T, HV}, [&] { return cat("[B, T, HV] = [", B, ", ", T, ", ", HV, "]"); }));
  FLASH_KDA_RETURN_IF_ERROR(expect_shape("out", a.out, {B, T, HV, V}, "[B, T, HV, V] like v"));
  if (a.A_log.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_shape("A_log", a.A_log, {HV}, [&] { return cat("[HV] = [", HV, "]"); }));
  if (!has_shape(a.dt_bias, {HV, K}) && !has_shape(a.dt_bias, {HV * K}))
    return invalid(cat("dt_bias: expected shape [HV, K] = [", HV, ", ", K, "] or [HV * K] = [", HV * K, "] (got ",
                       shape_text(a.dt_bias), ")"));
  *N = B;
  if (a.cu_seqlens.given) {
    if (a.cu_seqlens.ndim != 1 || a.cu_seqlens.shape[0] < 1)
      return invalid(cat("cu_seqlens: expected shape [N + 1] with N >= 0 (got ", shape_text(a.cu_seqlens), ")"));
    *N = a.cu_seqlens.shape[0] - 1;
  }
  if (a.cu_seqlens_cpu.given) {
    if (!a.cu_seqlens.given) return invalid("cu_seqlens_cpu: given without cu_seqlens");
    FLASH_KDA_RETURN_IF_ERROR(expect_shape("cu_seqlens_cpu", a.cu_seqlens_cpu, {*N + 1}, "[N + 1] like cu_seqlens"));
  }

  // ---- strides ----
  for (const Named& t : required) FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides(t));
  for (Named t : {Named{"cu_seqlens", &a.cu_seqlens}, {"cu_seqlens_cpu", &a.cu_seqlens_cpu}})
    FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides(t));
  FLASH_KDA_RETURN_IF_ERROR(activation_strides("q", a.q, true, &p->q_strides));
  FLASH_KDA_RETURN_IF_ERROR(activation_strides("k", a.k, true, &p->k_strides));
  FLASH_KDA_RETURN_IF_ERROR(activation_strides("v", a.v, true, &p->v_strides));
  FLASH_KDA_RETURN_IF_ERROR(activation_strides("g", a.g, true, &p->g_strides));
  FLASH_KDA_RETURN_IF_ERROR(activation_strides("out", a.out, true, &p->out_strides));
  FLASH_KDA_RETURN_IF_ERROR(activation_strides("beta", a.beta, false, &p->beta_strides));
  for (Named t : {Named{"A_log", &a.A_log},
                  {"dt_bias", &a.dt_bias},
                  {"cu_seqlens", &a.cu_seqlens},
                  {"cu_seqlens_cpu", &a.cu_seqlens_cpu}})
    if (t.t->given) FLASH_KDA_RETURN_IF_ERROR(expect_contiguous(t.name, *t.t));
  if (a.out.read_only) return invalid("out: array is read-only");

  p->batch = B;
  p->seqlen = T;
  p->heads = H;
  p->heads_v = HV;
  p->head_dim_k = K;
  p->head_dim_v = V;
  p->q = a.q.data;
  p->k = a.k.data;
  p->v = a.v.data;
  p->g = a.g.data;
  p->beta = a.beta.data;
  p->out = const_cast<void*>(a.out.data);
  p->A_log = static_cast<const float*>(a.A_log.data);
  p->dt_bias = static_cast<const float*>(a.dt_bias.data);
  p->scale = to_float(a.scale);
  if (a.has_lower_bound) {
    p->lower_bound = to_float(a.lower_bound);
  } else {
    p->gate = GateForm::kSoftplus;
  }
  p->allow_neg_eigval = a.allow_neg_eigval;
  if (a.cu_seqlens.given) {
    p->cu_seqlens = a.cu_seqlens.data;
    p->cu_seqlens_dtype = a.cu_seqlens.dtype;
    p->num_seqs = *N;
  }
  if (a.cu_seqlens_cpu.given) p->cu_seqlens_cpu = a.cu_seqlens_cpu.data;
  p->cpu_threads = a.cpu_threads;
  return Status::Ok();
}

// Every tensor on one device (cu_seqlens_cpu on the host), and the backend for it.
Status choose_backend(const CallArgs& a, std::initializer_list<Named> tensors, ProblemParams* p, int* device_id,
                      bool data_free) {
  const TensorArg& first = a.q;
  if (first.device == Device::kOther || (first.device == Device::kMeta && !data_free))
    return invalid(cat("q: unsupported device ", device_text(first), " (expected cpu or cuda)"));
  // The arrays fwd and decode share, then the call's own (`tensors`).
  const Named shared[] = {{"k", &a.k},
                          {"v", &a.v},
                          {"g", &a.g},
                          {"beta", &a.beta},
                          {"out", &a.out},
                          {"A_log", &a.A_log},
                          {"dt_bias", &a.dt_bias},
                          {"cu_seqlens", &a.cu_seqlens}};
  auto same_device = [&](const Named& t) {
    return !t.t->given ||
           (t.t->device == first.device && (first.device != Device::kCuda || t.t->device_id == first.device_id));
  };
  auto other_device = [&](const Named& t) {
    return invalid(cat(t.name, ": on device ", device_text(*t.t), ", but q is on ", device_text(first)));
  };
  for (const Named& t : shared)
    if (!same_device(t)) return other_device(t);
  for (const Named& t : tensors)
    if (!same_device(t)) return other_device(t);
  if (a.cu_seqlens_cpu.given && a.cu_seqlens_cpu.device != Device::kHost)
    return invalid(cat("cu_seqlens_cpu: must be in host memory (got device ", device_text(a.cu_seqlens_cpu), ")"));
  const bool cuda = first.device == Device::kCuda;
  *device_id = cuda ? first.device_id : 0;
  if (a.backend == "auto") {
    p->backend = cuda ? Backend::kCuda : Backend::kCpu;
  } else if (a.backend == "cuda") {
    if (!cuda && first.device != Device::kMeta)
      return invalid(cat("backend: 'cuda' needs CUDA tensors (got tensors on ", device_text(first), ")"));
    p->backend = Backend::kCuda;
  } else if (a.backend == "cpu" || a.backend == "reference") {
    if (cuda)
      return invalid(cat("backend: '", a.backend, "' needs host arrays (got tensors on ", device_text(first), ")"));
    p->backend = a.backend == "cpu" ? Backend::kCpu : Backend::kCpuReference;
  } else {
    return invalid(cat("backend: expected None, 'cuda', 'cpu' or 'reference' (got '", a.backend, "')"));
  }
  return Status::Ok();
}

template <class Text>
Status expect_state(const char* name, const TensorArg& t, int64_t slots, const ProblemParams& p, const Text& text) {
  FLASH_KDA_RETURN_IF_ERROR(expect_shape(name, t, {slots, p.heads_v, p.head_dim_v, p.head_dim_k}, text));
  FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides({name, &t}));
  return expect_contiguous(name, t);
}

std::string state_shape(const char* leading, const ProblemParams& p) {
  return cat("[", leading, ", HV, V, K] = [", leading, ", ", p.heads_v, ", ", p.head_dim_v, ", ", p.head_dim_k, "]");
}

// *p = Params{}, in place: assigning the temporary would build it and then copy it (hundreds of
// bytes, on every call). Value-initialisation gives every member its default, as Params{} does.
template <class Params>
void reset(Params* p) {
  static_assert(std::is_trivially_destructible_v<Params>, "reset() reuses the storage without a destructor");
  new (p) Params();
}

}  // namespace

Status fwd_params(const FwdArgs& a, FwdParams* p, int* device_id, bool data_free) {
  reset(p);
  int64_t N = 0;
  // ---- dtypes of the states and indices (the problem's own come first) ----
  FLASH_KDA_RETURN_IF_ERROR(problem_params(a, p, &N));
  if (a.initial_state.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("initial_state", a.initial_state, {DType::kF32, DType::kBF16}));
  if (a.final_state.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("final_state", a.final_state, {DType::kF32, DType::kBF16}));
  if (a.state_indices.given) FLASH_KDA_RETURN_IF_ERROR(expect_dtype("state_indices", a.state_indices, {DType::kI32}));
  if (a.has_initial_state.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("has_initial_state", a.has_initial_state, {DType::kBool, DType::kU8}));

  // ---- states: one per sequence, or pools of P slots addressed through state_indices ----
  int64_t slots = N;
  if (a.state_indices.given) {
    if (!a.initial_state.given && !a.final_state.given)
      return invalid("state_indices: needs initial_state or final_state (the pool)");
    const TensorArg& pool = a.initial_state.given ? a.initial_state : a.final_state;
    const char* pool_name = a.initial_state.given ? "initial_state" : "final_state";
    if (pool.ndim != 4)
      return invalid(cat(pool_name, ": expected shape ", state_shape("P", *p), " (got ", shape_text(pool), ")"));
    slots = pool.shape[0];
  }
  if (a.initial_state.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_state("initial_state", a.initial_state, slots, *p,
                                           [&] { return state_shape(a.state_indices.given ? "P" : "N", *p); }));
  if (a.final_state.given) {
    const auto text = [&] {
      return !a.state_indices.given  ? state_shape("N", *p)
             : a.initial_state.given ? cat("[P, HV, V, K] with P of initial_state (", slots, ")")
                                     : state_shape("P", *p);
    };
    FLASH_KDA_RETURN_IF_ERROR(expect_state("final_state", a.final_state, slots, *p, text));
    if (a.final_state.read_only) return invalid("final_state: array is read-only");
  }
  for (Named t : {Named{"state_indices", &a.state_indices}, {"has_initial_state", &a.has_initial_state}}) {
    if (!t.t->given) continue;
    FLASH_KDA_RETURN_IF_ERROR(expect_shape(t.name, *t.t, {N}, [&] { return cat("[N] = [", N, "]"); }));
    FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides(t));
    FLASH_KDA_RETURN_IF_ERROR(expect_contiguous(t.name, *t.t));
  }
  if (a.has_initial_state.given && !a.initial_state.given) return invalid("has_initial_state: needs initial_state");

  // ---- checkpoints: a pool [P2, HV, V, K], slots [N, M], starts [N] ----
  int64_t ckpt_columns = 0, ckpt_stride = 0;
  if (a.checkpoint_interval > 0) {
    for (Named t : {Named{"checkpoint_state", &a.checkpoint_state}, {"checkpoint_indices", &a.checkpoint_indices}})
      if (!t.t->given)
        return {StatusCode::kTypeMismatch, cat(t.name, ": expected an array with checkpoint_interval (got None)")};
  }
  if (a.checkpoint_state.given) {
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("checkpoint_state", a.checkpoint_state, {DType::kF32, DType::kBF16}));
    if (a.checkpoint_state.ndim != 4)
      return invalid(cat("checkpoint_state: expected shape ", state_shape("P2", *p), " (got ",
                         shape_text(a.checkpoint_state), ")"));
    FLASH_KDA_RETURN_IF_ERROR(expect_state("checkpoint_state", a.checkpoint_state, a.checkpoint_state.shape[0], *p,
                                           [&] { return state_shape("P2", *p); }));
    if (a.checkpoint_state.read_only) return invalid("checkpoint_state: array is read-only");
  }
  if (a.checkpoint_indices.given) {
    const TensorArg& ci = a.checkpoint_indices;
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("checkpoint_indices", ci, {DType::kI32}));
    if (ci.ndim != 2 || ci.shape[0] != N)
      return invalid(cat("checkpoint_indices: expected shape [N, M] with N=", N, " (got ", shape_text(ci), ")"));
    FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides({"checkpoint_indices", &ci}));
    ckpt_columns = ci.shape[1];
    if (ckpt_columns > 1 && N > 0 && ci.strides[1] != 1)
      return invalid(
          cat("checkpoint_indices: the last dimension must be contiguous (stride 1, got ", ci.strides[1], ")"));
    if (N > 1 && ckpt_columns > 0) {
      ckpt_stride = ci.strides[0];
      if (ckpt_stride < ckpt_columns)
        return invalid(cat("checkpoint_indices: row stride (", ckpt_stride, ") must be >= M (", ckpt_columns, ")"));
    }
  }
  if (a.checkpoint_start.given) {
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("checkpoint_start", a.checkpoint_start, {DType::kI64, DType::kI32}));
    FLASH_KDA_RETURN_IF_ERROR(
        expect_shape("checkpoint_start", a.checkpoint_start, {N}, [&] { return cat("[N] = [", N, "]"); }));
    FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides({"checkpoint_start", &a.checkpoint_start}));
    FLASH_KDA_RETURN_IF_ERROR(expect_contiguous("checkpoint_start", a.checkpoint_start));
  }

  FLASH_KDA_RETURN_IF_ERROR(choose_backend(a,
                                           {{"initial_state", &a.initial_state},
                                            {"final_state", &a.final_state},
                                            {"state_indices", &a.state_indices},
                                            {"has_initial_state", &a.has_initial_state},
                                            {"checkpoint_state", &a.checkpoint_state},
                                            {"checkpoint_indices", &a.checkpoint_indices},
                                            {"checkpoint_start", &a.checkpoint_start}},
                                           p, device_id, data_free));

  if (a.initial_state.given) {
    p->initial_state = a.initial_state.data;
    p->initial_state_dtype = a.initial_state.dtype;
  }
  if (a.final_state.given) {
    p->final_state = const_cast<void*>(a.final_state.data);
    p->final_state_dtype = a.final_state.dtype;
  }
  if (a.state_indices.given) {
    p->state_indices = static_cast<const int32_t*>(a.state_indices.data);
    p->pool_size = slots;
  }
  if (a.has_initial_state.given) p->has_initial_state = static_cast<const uint8_t*>(a.has_initial_state.data);
  p->checkpoint_interval = a.checkpoint_interval;
  if (a.checkpoint_state.given) {
    p->checkpoint_state = const_cast<void*>(a.checkpoint_state.data);
    p->checkpoint_state_dtype = a.checkpoint_state.dtype;
    p->checkpoint_pool_size = a.checkpoint_state.shape[0];
  }
  if (a.checkpoint_indices.given) {
    p->checkpoint_indices = static_cast<const int32_t*>(a.checkpoint_indices.data);
    p->checkpoint_columns = ckpt_columns;
    p->checkpoint_indices_stride = ckpt_stride;
  }
  if (a.checkpoint_start.given) {
    p->checkpoint_start = a.checkpoint_start.data;
    p->checkpoint_start_dtype = a.checkpoint_start.dtype;
  }
  return Status::Ok();
}

Status decode_params(const DecodeArgs& a, DecodeParams* p, int* device_id, bool data_free) {
  reset(p);
  int64_t N = 0;
  FLASH_KDA_RETURN_IF_ERROR(problem_params(a, p, &N));
  for (Named t : {Named{"state", &a.state}, {"state_indices", &a.state_indices}})
    if (!t.t->given) return {StatusCode::kTypeMismatch, cat(t.name, ": expected an array (got None)")};
  FLASH_KDA_RETURN_IF_ERROR(expect_dtype("state", a.state, {DType::kF32, DType::kBF16}));
  FLASH_KDA_RETURN_IF_ERROR(expect_dtype("state_indices", a.state_indices, {DType::kI32}));
  if (a.num_accepted_tokens.given)
    FLASH_KDA_RETURN_IF_ERROR(expect_dtype("num_accepted_tokens", a.num_accepted_tokens, {DType::kI32}));

  // ---- the pool ----
  if (a.state.ndim != 4)
    return invalid(cat("state: expected shape ", state_shape("P", *p), " (got ", shape_text(a.state), ")"));
  FLASH_KDA_RETURN_IF_ERROR(expect_state("state", a.state, a.state.shape[0], *p, [&] { return state_shape("P", *p); }));
  if (a.state.read_only) return invalid("state: array is read-only");

  // ---- slot indices [N] or [N, S] (rows state_indices.stride(0) apart) ----
  const TensorArg& idx = a.state_indices;
  if ((idx.ndim != 1 && idx.ndim != 2) || idx.shape[0] != N)
    return invalid(cat("state_indices: expected shape [N] or [N, S] with N=", N, " (got ", shape_text(idx), ")"));
  FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides({"state_indices", &idx}));
  const int64_t S = idx.ndim == 2 ? idx.shape[1] : 1;
  if (idx.ndim == 2 && S > 1 && N > 0 && idx.strides[1] != 1)
    return invalid(cat("state_indices: the last dimension must be contiguous (stride 1, got ", idx.strides[1], ")"));
  int64_t row_stride = 0;  // 0: contiguous rows of S
  if (N > 1 && S > 0) {
    row_stride = idx.strides[0];
    if (row_stride < S) return invalid(cat("state_indices: row stride (", row_stride, ") must be >= S (", S, ")"));
  }
  if (a.num_accepted_tokens.given) {
    if (idx.ndim != 2 || S < 2)
      return invalid("num_accepted_tokens: needs speculative state_indices [N, S] with S > 1");
    FLASH_KDA_RETURN_IF_ERROR(
        expect_shape("num_accepted_tokens", a.num_accepted_tokens, {N}, [&] { return cat("[N] = [", N, "]"); }));
    FLASH_KDA_RETURN_IF_ERROR(expect_no_negative_strides({"num_accepted_tokens", &a.num_accepted_tokens}));
    FLASH_KDA_RETURN_IF_ERROR(expect_contiguous("num_accepted_tokens", a.num_accepted_tokens));
  }

  FLASH_KDA_RETURN_IF_ERROR(choose_backend(
      a, {{"state", &a.state}, {"state_indices", &a.state_indices}, {"num_accepted_tokens", &a.num_accepted_tokens}}, p,
      device_id, data_free));

  p->state = const_cast<void*>(a.state.data);
  p->state_dtype = a.state.dtype;
  p->pool_size = a.state.shape[0];
  p->state_indices = static_cast<const int32_t*>(idx.data);
  p->slots_per_seq = S;
  p->state_indices_stride = row_stride;
  if (a.num_accepted_tokens.given) p->num_accepted_tokens = static_cast<const int32_t*>(a.num_accepted_tokens.data);
  return Status::Ok();
}

Status check_fwd(const FwdArgs& a) {
  FwdParams p;
  int device = 0;
  FLASH_KDA_RETURN_IF_ERROR(fwd_params(a, &p, &device, /*data_free=*/true));
  normalise(p);
  return check(p, nullptr, /*data_free=*/true);
}

Status check_decode(const DecodeArgs& a) {
  DecodeParams p;
  int device = 0;
  FLASH_KDA_RETURN_IF_ERROR(decode_params(a, &p, &device, /*data_free=*/true));
  normalise(p);
  return check(p, nullptr, /*data_free=*/true);
}

}  // namespace flash_kda
