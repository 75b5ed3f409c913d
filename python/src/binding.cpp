// flash_kda._C: the nanobind layer between Python arrays and the C++ API.
//
// It only translates: DLPack arrays (NumPy, PyTorch; host or CUDA) become one FwdParams (or
// DecodeParams) with element strides read from the arrays, flash_kda::fwd (or decode) runs with the
// GIL released, and a Status that is not ok becomes a Python exception. The package
// (flash_kda/__init__.py) performs the user-facing checks; the checks here are the ones memory
// safety depends on (ranks, extents, dtypes, devices), so that calling _C directly cannot read or
// write outside an array either.
//
// Status codes map to exceptions as follows:
//   kInvalidArgument -> ValueError          kTypeMismatch -> TypeError
//   kUnsupported     -> NotImplementedError (a subclass of RuntimeError)
//   kCudaError       -> RuntimeError
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

#include "flash_kda/flash_kda.h"

namespace nb = nanobind;
using flash_kda::ActStrides;
using flash_kda::Backend;
using flash_kda::DecodeParams;
using flash_kda::DType;
using flash_kda::FwdParams;
using flash_kda::Status;
using flash_kda::StatusCode;

namespace {

using Input = nb::ndarray<nb::ro>;  // read-only arrays (e.g. a NumPy array with writeable=False) pass
using Output = nb::ndarray<>;

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void raise_status(const Status& s) {
  switch (s.code) {
    case StatusCode::kOk: return;
    case StatusCode::kInvalidArgument: raise(PyExc_ValueError, s.message);
    case StatusCode::kTypeMismatch: raise(PyExc_TypeError, s.message);
    case StatusCode::kUnsupported: raise(PyExc_NotImplementedError, s.message);
    case StatusCode::kCudaError: raise(PyExc_RuntimeError, s.message);
  }
  raise(PyExc_RuntimeError, s.message);
}

// ---- dtypes ----------------------------------------------------------------------------------

// NumPy has no native bfloat16 that DLPack can carry (ml_dtypes' is a user dtype), so the package
// passes bf16 NumPy arrays as uint16 views of the same bits; both spellings mean bf16 here unless
// `strict` (torch tensors, which carry a real bfloat16: an int16 tensor must not pass as bf16).
DType dtype_of(const nb::dlpack::dtype& d, bool strict = false) {
  using Code = nb::dlpack::dtype_code;
  if (d.lanes != 1) return DType::kNone;
  const auto code = Code(d.code);
  if (d.bits == 16 && (code == Code::Bfloat || (!strict && (code == Code::UInt || code == Code::Int))))
    return DType::kBF16;
  if (d.bits == 32 && code == Code::Float) return DType::kF32;
  if (d.bits == 32 && code == Code::Int) return DType::kI32;
  if (d.bits == 64 && code == Code::Int) return DType::kI64;
  return DType::kNone;
}

std::string describe_dtype(const nb::dlpack::dtype& d) {
  using Code = nb::dlpack::dtype_code;
  const char* kind = "?";
  switch (Code(d.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: kind = "bool"; break;
    default: kind = "dtype-code-"; break;
  }
  return cat(kind, int(d.bits));
}

template <typename Array>
DType require_dtype(const char* name, const Array& a, bool strict, DType want1, DType want2 = DType::kNone) {
  const DType got = dtype_of(a.dtype(), strict);
  if (got != want1 && (want2 == DType::kNone || got != want2)) {
    std::string want = flash_kda::dtype_name(want1);
    if (want2 != DType::kNone) want += cat(" or ", flash_kda::dtype_name(want2));
    raise(PyExc_TypeError, cat(name, ": dtype must be ", want, " (got ", describe_dtype(a.dtype()), ")"));
  }
  return got;
}

// bool or uint8 flags (one byte each); FwdParams::has_initial_state reads them as uint8, 0 = false.
template <typename Array>
void require_flag_dtype(const char* name, const Array& a) {
  using Code = nb::dlpack::dtype_code;
  const auto d = a.dtype();
  if (d.lanes != 1 || d.bits != 8 || (Code(d.code) != Code::Bool && Code(d.code) != Code::UInt))
    raise(PyExc_TypeError, cat(name, ": dtype must be bool or uint8 (got ", describe_dtype(d), ")"));
}

// ---- shapes and strides ------------------------------------------------------------------------

template <typename Array>
std::string shape_string(const Array& a) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << "]";
  return os.str();
}

template <typename Array>
void require_shape(const char* name, const Array& a, std::initializer_list<int64_t> shape,
                   const char* expected) {
  bool ok = a.ndim() == shape.size();
  size_t i = 0;
  for (int64_t extent : shape) {
    if (!ok) break;
    ok = int64_t(a.shape(i++)) == extent;
  }
  if (!ok) raise(PyExc_ValueError, cat(name, ": expected shape ", expected, " (got ", shape_string(a), ")"));
}

template <typename Array>
bool is_contiguous(const Array& a) {
  if (a.size() == 0) return true;  // no element has an address; frameworks report arbitrary strides
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= int64_t(a.shape(i));
  }
  return true;
}

template <typename Array>
void require_contiguous(const char* name, const Array& a) {
  if (!is_contiguous(a)) raise(PyExc_ValueError, cat(name, ": must be contiguous"));
}

// Strides of a [B, T, heads, D] activation (or [B, T, HV] for beta, dim == 0). The stride of a
// dimension of extent 1 never affects an address, so it is replaced by the value a contiguous
// tensor would have; the alignment checks of the CUDA backend then see only strides that matter.
template <typename Array>
ActStrides activation_strides(const char* name, const Array& a, bool has_dim) {
  if (a.size() == 0) return {};  // never dereferenced: fwd checks and reads nothing when B*T == 0
  if (has_dim && a.shape(3) > 1 && a.stride(3) != 1)
    raise(PyExc_ValueError, cat(name, ": the last dimension must be contiguous (stride 1, got ", a.stride(3), ")"));
  int64_t inner = has_dim ? int64_t(a.shape(3)) : 1;  // elements spanned by the dimensions inside
  int64_t s[3];  // batch, token, head
  for (size_t i = 3; i-- > 0;) {
    s[i] = a.shape(i) == 1 ? inner : a.stride(i);
    inner = s[i] * int64_t(a.shape(i));
  }
  ActStrides out{s[0], s[1], s[2]};
  // An all-zero triple means "contiguous" to the C++ API; only broadcast views produce one.
  if (a.size() > 1 && out.batch == 0 && out.token == 0 && out.head == 0)
    raise(PyExc_ValueError, cat(name, ": broadcast (stride 0) views are not supported"));
  return out;
}

// ---- devices ---------------------------------------------------------------------------------

enum class Place { kHost, kCuda };

struct DeviceCheck {
  bool seen = false;
  Place place = Place::kHost;
  int device_id = 0;
  const char* first = nullptr;

  template <typename Array>
  void add(const char* name, const Array& a) {
    Place pl;
    if (a.device_type() == nb::device::cpu::value) {
      pl = Place::kHost;
    } else if (a.device_type() == nb::device::cuda::value) {
      pl = Place::kCuda;
    } else {
      raise(PyExc_ValueError, cat(name, ": unsupported device (DLPack device type ", a.device_type(),
                                  "); expected host memory or a CUDA device"));
    }
    const int id = pl == Place::kCuda ? a.device_id() : 0;
    if (!seen) {
      seen = true;
      place = pl;
      device_id = id;
      first = name;
    } else if (pl != place || id != device_id) {
      raise(PyExc_ValueError, cat(name, ": on a different device than ", first));
    }
  }
};

Backend choose_backend(const std::string& backend, Place place) {
  if (backend == "auto") return place == Place::kCuda ? Backend::kCuda : Backend::kCpu;
  if (backend == "cuda") {
    if (place != Place::kCuda) raise(PyExc_ValueError, "backend: 'cuda' needs CUDA device arrays");
    return Backend::kCuda;
  }
  if (backend == "cpu" || backend == "reference") {
    if (place != Place::kHost)
      raise(PyExc_ValueError, cat("backend: '", backend, "' needs host arrays (got CUDA device arrays)"));
    return backend == "cpu" ? Backend::kCpu : Backend::kCpuReference;
  }
  raise(PyExc_ValueError, cat("backend: expected 'auto', 'cuda', 'cpu' or 'reference' (got '", backend, "')"));
}

// ---- the parameter struct ------------------------------------------------------------------------

struct Arrays {
  Input q, k, v, g, beta;
  Output out;
  Input A_log, dt_bias;
  std::optional<Input> initial_state;
  std::optional<Output> final_state;
  std::optional<Input> cu_seqlens;
  std::optional<Input> state_indices;      // int32 [N]: the states are pools [P, HV, V, K]
  std::optional<Input> has_initial_state;  // bool / uint8 [N]
};

FwdParams make_params(const Arrays& a, double scale, double lower_bound, const std::string& backend,
                      int cpu_threads, bool strict) {
  // ---- sizes from q and v ----
  if (a.q.ndim() != 4) raise(PyExc_ValueError, cat("q: expected shape [B, T, H, K] (got ", shape_string(a.q), ")"));
  if (a.v.ndim() != 4) raise(PyExc_ValueError, cat("v: expected shape [B, T, HV, V] (got ", shape_string(a.v), ")"));
  const int64_t B = int64_t(a.q.shape(0)), T = int64_t(a.q.shape(1)), H = int64_t(a.q.shape(2)),
                K = int64_t(a.q.shape(3));
  const int64_t HV = int64_t(a.v.shape(2)), V = int64_t(a.v.shape(3));
  require_shape("k", a.k, {B, T, H, K}, "[B, T, H, K] like q");
  require_shape("v", a.v, {B, T, HV, V}, "[B, T, HV, V] with B, T of q");
  require_shape("g", a.g, {B, T, HV, K}, "[B, T, HV, K]");
  require_shape("beta", a.beta, {B, T, HV}, "[B, T, HV]");
  require_shape("out", a.out, {B, T, HV, V}, "[B, T, HV, V] like v");
  require_shape("A_log", a.A_log, {HV}, "[HV]");
  if (a.dt_bias.ndim() == 1)
    require_shape("dt_bias", a.dt_bias, {HV * K}, "[HV, K] or [HV * K]");
  else
    require_shape("dt_bias", a.dt_bias, {HV, K}, "[HV, K] or [HV * K]");

  for (auto [name, arr] : {std::pair<const char*, const Input*>{"q", &a.q}, {"k", &a.k}, {"v", &a.v},
                           {"g", &a.g}, {"beta", &a.beta}})
    require_dtype(name, *arr, strict, DType::kBF16);
  require_dtype("out", a.out, strict, DType::kBF16);
  require_dtype("A_log", a.A_log, strict, DType::kF32);
  require_dtype("dt_bias", a.dt_bias, strict, DType::kF32);
  require_contiguous("A_log", a.A_log);
  require_contiguous("dt_bias", a.dt_bias);

  FwdParams p;
  p.batch = B;
  p.seqlen = T;
  p.heads = H;
  p.heads_v = HV;
  p.head_dim_k = K;
  p.head_dim_v = V;
  p.q = a.q.data();
  p.k = a.k.data();
  p.v = a.v.data();
  p.g = a.g.data();
  p.beta = a.beta.data();
  p.out = a.out.data();
  p.A_log = static_cast<const float*>(a.A_log.data());
  p.dt_bias = static_cast<const float*>(a.dt_bias.data());
  p.scale = float(scale);
  p.lower_bound = float(lower_bound);
  p.q_strides = activation_strides("q", a.q, true);
  p.k_strides = activation_strides("k", a.k, true);
  p.v_strides = activation_strides("v", a.v, true);
  p.g_strides = activation_strides("g", a.g, true);
  p.out_strides = activation_strides("out", a.out, true);
  p.beta_strides = activation_strides("beta", a.beta, false);

  // ---- variable length ----
  int64_t N = B;
  if (a.cu_seqlens) {
    const Input& cu = *a.cu_seqlens;
    p.cu_seqlens_dtype = require_dtype("cu_seqlens", cu, strict, DType::kI64, DType::kI32);
    if (cu.ndim() != 1 || cu.shape(0) < 1)
      raise(PyExc_ValueError, cat("cu_seqlens: expected shape [N + 1] with N >= 0 (got ", shape_string(cu), ")"));
    require_contiguous("cu_seqlens", cu);
    N = int64_t(cu.shape(0)) - 1;
    p.cu_seqlens = cu.data();
    p.num_seqs = N;
  }

  // ---- states: one per sequence, or pools of P slots addressed through state_indices ----
  int64_t slots = N;
  const char* initial_shape = "[N, HV, V, K]";
  const char* final_shape = "[N, HV, V, K]";
  if (a.state_indices) {
    if (!a.initial_state && !a.final_state)
      raise(PyExc_ValueError, "state_indices: needs initial_state or final_state (the pool)");
    auto leading = [](const auto& arr) { return arr.ndim() == 4 ? int64_t(arr.shape(0)) : int64_t(-1); };
    slots = a.initial_state ? leading(*a.initial_state) : leading(*a.final_state);
    initial_shape = "[P, HV, V, K]";
    final_shape = a.initial_state ? "[P, HV, V, K] with P of initial_state" : "[P, HV, V, K]";
  }
  DType state_dtype = DType::kNone;
  if (a.initial_state) {
    state_dtype = require_dtype("initial_state", *a.initial_state, strict, DType::kF32, DType::kBF16);
    require_shape("initial_state", *a.initial_state, {slots, HV, V, K}, initial_shape);
    require_contiguous("initial_state", *a.initial_state);
    p.initial_state = a.initial_state->data();
  }
  if (a.final_state) {
    const DType d = require_dtype("final_state", *a.final_state, strict, DType::kF32, DType::kBF16);
    if (state_dtype != DType::kNone && d != state_dtype)
      raise(PyExc_TypeError, cat("final_state: dtype must match initial_state (", flash_kda::dtype_name(state_dtype),
                                 ", got ", flash_kda::dtype_name(d), ")"));
    state_dtype = d;
    require_shape("final_state", *a.final_state, {slots, HV, V, K}, final_shape);
    require_contiguous("final_state", *a.final_state);
    p.final_state = a.final_state->data();
  }
  if (a.state_indices) {
    require_dtype("state_indices", *a.state_indices, strict, DType::kI32);
    require_shape("state_indices", *a.state_indices, {N}, "[N]");
    require_contiguous("state_indices", *a.state_indices);
    p.state_indices = static_cast<const int32_t*>(a.state_indices->data());
    p.pool_size = slots;
  }
  if (a.has_initial_state) {
    require_flag_dtype("has_initial_state", *a.has_initial_state);
    require_shape("has_initial_state", *a.has_initial_state, {N}, "[N]");
    require_contiguous("has_initial_state", *a.has_initial_state);
    if (!a.initial_state) raise(PyExc_ValueError, "has_initial_state: needs initial_state");
    p.has_initial_state = static_cast<const uint8_t*>(a.has_initial_state->data());
  }
  p.state_dtype = state_dtype;

  // ---- device and backend ----
  DeviceCheck dev;
  for (auto [name, arr] : {std::pair<const char*, const Input*>{"q", &a.q}, {"k", &a.k}, {"v", &a.v},
                           {"g", &a.g}, {"beta", &a.beta}, {"A_log", &a.A_log}, {"dt_bias", &a.dt_bias}})
    dev.add(name, *arr);
  dev.add("out", a.out);
  if (a.initial_state) dev.add("initial_state", *a.initial_state);
  if (a.final_state) dev.add("final_state", *a.final_state);
  if (a.cu_seqlens) dev.add("cu_seqlens", *a.cu_seqlens);
  if (a.state_indices) dev.add("state_indices", *a.state_indices);
  if (a.has_initial_state) dev.add("has_initial_state", *a.has_initial_state);
  p.backend = choose_backend(backend, dev.place);
  p.cpu_threads = cpu_threads;
  return p;
}

Arrays collect(Input q, Input k, Input v, Input g, Input beta, Output out, Input A_log, Input dt_bias,
               std::optional<Input> initial_state, std::optional<Output> final_state,
               std::optional<Input> cu_seqlens, std::optional<Input> state_indices = std::nullopt,
               std::optional<Input> has_initial_state = std::nullopt) {
  return Arrays{q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, state_indices,
                has_initial_state};
}

// Returns 0 once the forward has run. With query_workspace and no workspace given, a call that
// needs scratch memory runs nothing and returns the bytes it needs instead (so that the torch route
// prepares its arguments once per call rather than twice; see flash_kda/torch_ops.py).
size_t fwd(Input q, Input k, Input v, Input g, Input beta, double scale, Output out, Input A_log,
           Input dt_bias, double lower_bound, std::optional<Input> initial_state,
           std::optional<Output> final_state, std::optional<Input> cu_seqlens,
           std::optional<Input> state_indices, std::optional<Input> has_initial_state, const std::string& backend,
           std::optional<Output> workspace, uintptr_t stream, int cpu_threads, bool query_workspace,
           bool strict_dtypes) {
  const Arrays arrays = collect(q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens,
                                state_indices, has_initial_state);
  FwdParams p = make_params(arrays, scale, lower_bound, backend, cpu_threads, strict_dtypes);
  if (query_workspace && !workspace) {
    const size_t needed = flash_kda::workspace_size(p);
    if (needed > 0) return needed;
  }
  if (workspace) {
    if (p.backend == Backend::kCuda &&
        (workspace->device_type() != nb::device::cuda::value || workspace->device_id() != out.device_id()))
      raise(PyExc_ValueError, "workspace: must be on the same device as out");
    if (!is_contiguous(*workspace)) raise(PyExc_ValueError, "workspace: must be contiguous");
    p.workspace = workspace->data();
    p.workspace_bytes = workspace->nbytes();
  }
  Status s;
  {
    // The arrays stay alive in this frame's arguments while other Python threads run.
    nb::gil_scoped_release release;
    s = flash_kda::fwd(p, reinterpret_cast<cudaStream_t>(stream));
  }
  raise_status(s);
  return 0;
}

size_t workspace_size(Input q, Input k, Input v, Input g, Input beta, double scale, Output out, Input A_log,
                      Input dt_bias, double lower_bound, std::optional<Input> initial_state,
                      std::optional<Output> final_state, std::optional<Input> cu_seqlens,
                      std::optional<Input> state_indices, std::optional<Input> has_initial_state,
                      const std::string& backend) {
  const Arrays arrays = collect(q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens,
                                state_indices, has_initial_state);
  return flash_kda::workspace_size(make_params(arrays, scale, lower_bound, backend, 0, false));
}

// The decode step on a state pool (flash_kda::decode; docs/serving.md). The activations and
// cu_seqlens are checked as for fwd; state is the pool [P, HV, V, K] (P = state.shape[0]) and
// state_indices int32 [N] or [N, S] (S = slots per sequence; the row stride is read from the array).
void decode(Input q, Input k, Input v, Input g, Input beta, double scale, Output out, Input A_log,
            Input dt_bias, double lower_bound, Output state, Input state_indices,
            std::optional<Input> num_accepted_tokens, std::optional<Input> cu_seqlens,
            const std::string& backend, uintptr_t stream, int cpu_threads, bool strict_dtypes) {
  const Arrays arrays = collect(q, k, v, g, beta, out, A_log, dt_bias, std::nullopt, std::nullopt, cu_seqlens);
  const FwdParams f = make_params(arrays, scale, lower_bound, backend, cpu_threads, strict_dtypes);
  const int64_t N = f.cu_seqlens ? f.num_seqs : f.batch;
  const int64_t HV = f.heads_v, V = f.head_dim_v, K = f.head_dim_k;

  // ---- the pool ----
  const DType state_dtype = require_dtype("state", state, strict_dtypes, DType::kF32, DType::kBF16);
  if (state.ndim() != 4)
    raise(PyExc_ValueError, cat("state: expected shape [P, HV, V, K] (got ", shape_string(state), ")"));
  const int64_t P = int64_t(state.shape(0));
  require_shape("state", state, {P, HV, V, K}, "[P, HV, V, K]");
  require_contiguous("state", state);

  // ---- slot indices ----
  require_dtype("state_indices", state_indices, strict_dtypes, DType::kI32);
  const Input& idx = state_indices;
  if ((idx.ndim() != 1 && idx.ndim() != 2) || int64_t(idx.shape(0)) != N)
    raise(PyExc_ValueError, cat("state_indices: expected shape [N] or [N, S] with N=", N, " (got ",
                                shape_string(idx), ")"));
  const int64_t S = idx.ndim() == 2 ? int64_t(idx.shape(1)) : 1;
  if (idx.ndim() == 2 && S > 1 && N > 0 && idx.stride(1) != 1)
    raise(PyExc_ValueError, cat("state_indices: the last dimension must be contiguous (stride 1, got ",
                                idx.stride(1), ")"));
  int64_t row_stride = 0;  // 0: contiguous rows of S
  if (N > 1 && S > 0) {
    row_stride = idx.stride(0);
    if (row_stride < S)
      raise(PyExc_ValueError, cat("state_indices: row stride (", row_stride, ") must be >= S (", S, ")"));
  }
  if (num_accepted_tokens) {
    require_dtype("num_accepted_tokens", *num_accepted_tokens, strict_dtypes, DType::kI32);
    require_shape("num_accepted_tokens", *num_accepted_tokens, {N}, "[N]");
    require_contiguous("num_accepted_tokens", *num_accepted_tokens);
  }

  // ---- device and backend (over every array) ----
  DeviceCheck dev;
  for (auto [name, arr] : {std::pair<const char*, const Input*>{"q", &q}, {"k", &k}, {"v", &v}, {"g", &g},
                           {"beta", &beta}, {"A_log", &A_log}, {"dt_bias", &dt_bias},
                           {"state_indices", &state_indices}})
    dev.add(name, *arr);
  dev.add("out", out);
  dev.add("state", state);
  if (num_accepted_tokens) dev.add("num_accepted_tokens", *num_accepted_tokens);
  if (cu_seqlens) dev.add("cu_seqlens", *cu_seqlens);

  DecodeParams p;
  p.batch = f.batch;
  p.seqlen = f.seqlen;
  p.heads = f.heads;
  p.heads_v = f.heads_v;
  p.head_dim_k = K;
  p.head_dim_v = V;
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.g = f.g;
  p.beta = f.beta;
  p.A_log = f.A_log;
  p.dt_bias = f.dt_bias;
  p.scale = f.scale;
  p.lower_bound = f.lower_bound;
  p.out = f.out;
  p.q_strides = f.q_strides;
  p.k_strides = f.k_strides;
  p.v_strides = f.v_strides;
  p.g_strides = f.g_strides;
  p.out_strides = f.out_strides;
  p.beta_strides = f.beta_strides;
  p.state = state.data();
  p.state_dtype = state_dtype;
  p.pool_size = P;
  p.state_indices = static_cast<const int32_t*>(idx.data());
  p.slots_per_seq = S;
  p.state_indices_stride = row_stride;
  p.num_accepted_tokens =
      num_accepted_tokens ? static_cast<const int32_t*>(num_accepted_tokens->data()) : nullptr;
  p.cu_seqlens = f.cu_seqlens;
  p.cu_seqlens_dtype = f.cu_seqlens_dtype;
  p.num_seqs = f.num_seqs;
  p.backend = choose_backend(backend, dev.place);
  p.cpu_threads = cpu_threads;
  Status s;
  {
    nb::gil_scoped_release release;
    s = flash_kda::decode(p, reinterpret_cast<cudaStream_t>(stream));
  }
  raise_status(s);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flash-kda: the compiled Kimi Delta Attention forward (use the flash_kda package instead)";

  m.def("fwd", &fwd, nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
        nb::arg("g").noconvert(), nb::arg("beta").noconvert(), nb::arg("scale"), nb::arg("out").noconvert(),
        nb::arg("A_log").noconvert(), nb::arg("dt_bias").noconvert(), nb::arg("lower_bound"),
        nb::arg("initial_state").noconvert().none(), nb::arg("final_state").noconvert().none(),
        nb::arg("cu_seqlens").noconvert().none(), nb::arg("state_indices").noconvert().none() = nb::none(),
        nb::arg("has_initial_state").noconvert().none() = nb::none(), nb::kw_only(), nb::arg("backend") = "auto",
        nb::arg("workspace").noconvert().none() = nb::none(), nb::arg("stream") = 0,
        nb::arg("cpu_threads") = 0, nb::arg("query_workspace") = false, nb::arg("strict_dtypes") = false,
        "Runs the KDA forward in place on DLPack arrays (bf16 given as bfloat16 or as 16-bit integer "
        "views) and returns 0. backend: 'auto' (where the arrays live), 'cuda', 'cpu' or 'reference'. "
        "stream: a cudaStream_t as an integer (0: the legacy default stream). query_workspace: when "
        "no workspace is given and the call needs one, run nothing and return its size in bytes. "
        "strict_dtypes: bf16 must be DLPack bfloat16 (16-bit integers are not taken as bf16 bits). "
        "state_indices (int32 [N]): the states are pools [P, HV, V, K] and sequence n uses slot "
        "state_indices[n] (negative: padding); has_initial_state (bool or uint8 [N]): 0 starts sequence n "
        "from zeros (docs/serving.md).");

  m.def("workspace_size", &workspace_size, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
        nb::arg("v").noconvert(), nb::arg("g").noconvert(), nb::arg("beta").noconvert(), nb::arg("scale"),
        nb::arg("out").noconvert(), nb::arg("A_log").noconvert(), nb::arg("dt_bias").noconvert(),
        nb::arg("lower_bound"), nb::arg("initial_state").noconvert().none(),
        nb::arg("final_state").noconvert().none(), nb::arg("cu_seqlens").noconvert().none(),
        nb::arg("state_indices").noconvert().none() = nb::none(),
        nb::arg("has_initial_state").noconvert().none() = nb::none(), nb::kw_only(), nb::arg("backend") = "auto",
        "Bytes of device scratch memory fwd needs for these arguments (0 when none).");

  m.def("decode", &decode, nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
        nb::arg("g").noconvert(), nb::arg("beta").noconvert(), nb::arg("scale"), nb::arg("out").noconvert(),
        nb::arg("A_log").noconvert(), nb::arg("dt_bias").noconvert(), nb::arg("lower_bound"),
        nb::arg("state").noconvert(), nb::arg("state_indices").noconvert(),
        nb::arg("num_accepted_tokens").noconvert().none() = nb::none(),
        nb::arg("cu_seqlens").noconvert().none() = nb::none(), nb::kw_only(), nb::arg("backend") = "auto",
        nb::arg("stream") = 0, nb::arg("cpu_threads") = 0, nb::arg("strict_dtypes") = false,
        "Runs one decode step (1 to 8 tokens per sequence) in place on DLPack arrays: writes out and "
        "the pool `state` [P, HV, V, K] through int32 state_indices [N] or [N, S] (docs/serving.md). "
        "backend, stream and strict_dtypes as for fwd.");

  m.def("cuda_available", &flash_kda::cuda_available,
        "True when this build has the CUDA kernels and a compute capability 9.0 device is present.");

#ifdef FLASH_KDA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
