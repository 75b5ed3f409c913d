// flash_kda._C: the nanobind layer between Python arrays and the C++ API.
//
// It only translates: each DLPack array (NumPy, PyTorch; host or CUDA) becomes a tensor
// description (src/api/tensors.h), the C++ contract layer turns those into one FwdParams (or
// DecodeParams) and checks them, flash_kda::fwd (or decode) runs with the GIL released, and a
// Status that is not ok becomes a Python exception. No argument is checked here: every rule lives
// in src/api. check_fwd / check_decode take descriptions without data (torch's fake tensors).
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

#include "api/tensors.h"
#include "flash_kda/flash_kda.h"

namespace nb = nanobind;
using flash_kda::Backend;
using flash_kda::DecodeArgs;
using flash_kda::DecodeParams;
using flash_kda::Device;
using flash_kda::DType;
using flash_kda::FwdArgs;
using flash_kda::FwdParams;
using flash_kda::Status;
using flash_kda::StatusCode;
using flash_kda::TensorArg;

namespace {

// Every array is taken read-only here (a read-only NumPy array converts); whether the caller's
// array may be written is passed separately (the read_only mask) and checked in src/api.
using Array = nb::ndarray<nb::ro>;
using OptArray = std::optional<Array>;

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

std::string name_of_type(nb::handle h) { return nb::cast<std::string>(nb::type_name(h.type())); }

// scale and lower_bound: any real number (float, int, NumPy scalar, 0-dim tensor), named in errors.
double real_number(const char* name, nb::handle h) {
  PyObject* o = h.ptr();
  if (o == Py_None || PyUnicode_Check(o) || PyBytes_Check(o))
    raise(PyExc_TypeError, cat(name, ": expected a real number (got ", name_of_type(h), ")"));
  const double x = PyFloat_AsDouble(o);
  if (x == -1.0 && PyErr_Occurred()) {
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
    PyErr_Clear();
    if (overflow) raise(PyExc_ValueError, cat(name, ": must be finite (got a number too large for a float)"));
    raise(PyExc_TypeError, cat(name, ": expected a real number (got ", name_of_type(h), ")"));
  }
  return x;
}

// lower_bound: a real number (the sigmoid gate), or None (the softplus gate, GateForm::kSoftplus).
void set_lower_bound(flash_kda::CallArgs& c, nb::handle lower_bound) {
  c.has_lower_bound = !lower_bound.is_none();
  if (c.has_lower_bound) c.lower_bound = real_number("lower_bound", lower_bound);
}

// checkpoint_interval: None (0: no checkpoints) or an integer (int, NumPy integer, anything with
// __index__; not bool), named in errors. Its range is checked in src/api.
int64_t optional_integer(const char* name, nb::handle h) {
  PyObject* o = h.ptr();
  if (o == Py_None) return 0;
  if (PyBool_Check(o) || !PyIndex_Check(o))
    raise(PyExc_TypeError, cat(name, ": expected an integer or None (got ", name_of_type(h), ")"));
  const long long x = PyLong_AsLongLong(nb::steal(PyNumber_Index(o)).ptr());
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    raise(PyExc_ValueError, cat(name, ": out of range"));
  }
  return int64_t(x);
}

// ---- DLPack arrays -> tensor descriptions ---------------------------------------------------------

// NumPy has no bfloat16 that DLPack can carry (ml_dtypes' is a user dtype), so the package passes
// bf16 NumPy arrays as uint16 views of the same bits and says so in `bf16_bits` (bit i: argument i).
void set_dtype(TensorArg& t, const nb::dlpack::dtype& d, bool bf16_bits) {
  using Code = nb::dlpack::dtype_code;
  const auto code = Code(d.code);
  if (d.lanes == 1) {
    if (d.bits == 16 && (code == Code::Bfloat || (bf16_bits && (code == Code::UInt || code == Code::Int))))
      t.dtype = DType::kBF16;
    else if (d.bits == 32 && code == Code::Float)
      t.dtype = DType::kF32;
    else if (d.bits == 32 && code == Code::Int)
      t.dtype = DType::kI32;
    else if (d.bits == 64 && code == Code::Int)
      t.dtype = DType::kI64;
    else if (d.bits == 8 && code == Code::UInt)
      t.dtype = DType::kU8;
    else if (d.bits == 8 && code == Code::Bool)
      t.dtype = DType::kBool;
  }
  if (t.dtype != DType::kNone) return;  // the words are only needed for a message
  const char* kind = "dtype-code-";
  switch (code) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: kind = "bool"; break;
    default: break;
  }
  t.dtype_text = code == Code::Bool ? std::string("bool") : cat(kind, int(d.bits));
  if (d.lanes != 1) t.dtype_text += cat("x", int(d.lanes));
}

TensorArg describe(const OptArray& a, int index, uint64_t bf16_bits, uint64_t read_only) {
  TensorArg t;
  if (!a) return t;
  t.given = true;
  t.data = a->data();
  set_dtype(t, a->dtype(), (bf16_bits >> index) & 1);
  t.ndim = int(a->ndim());
  for (int i = 0; i < t.ndim && i < flash_kda::kMaxTensorRank; ++i) {
    t.shape[i] = int64_t(a->shape(size_t(i)));
    t.strides[i] = int64_t(a->stride(size_t(i)));
  }
  if (a->device_type() == nb::device::cpu::value) {
    t.device = Device::kHost;
  } else if (a->device_type() == nb::device::cuda::value) {
    t.device = Device::kCuda;
    t.device_id = a->device_id();
  } else {
    t.device = Device::kOther;
    t.device_text = cat("DLPack device type ", a->device_type());
  }
  t.read_only = (read_only >> index) & 1;
  return t;
}

// A tensor without data, as torch's fake tensors give it: None or (dtype, shape, strides, device
// type, device index), dtype and device in torch's words ("bfloat16", "cuda").
TensorArg describe_meta(nb::handle h, int index) {
  TensorArg t;
  if (h.is_none()) return t;
  const nb::tuple d = nb::cast<nb::tuple>(h);
  t.given = true;
  t.data = reinterpret_cast<const void*>(uintptr_t(64) * uintptr_t(index + 1));  // marks it present
  const std::string dtype = nb::cast<std::string>(d[0]);
  if (dtype == "bfloat16")
    t.dtype = DType::kBF16;
  else if (dtype == "float32")
    t.dtype = DType::kF32;
  else if (dtype == "int32")
    t.dtype = DType::kI32;
  else if (dtype == "int64")
    t.dtype = DType::kI64;
  else if (dtype == "uint8")
    t.dtype = DType::kU8;
  else if (dtype == "bool")
    t.dtype = DType::kBool;
  else
    t.dtype_text = dtype;
  const nb::tuple shape = nb::cast<nb::tuple>(d[1]), strides = nb::cast<nb::tuple>(d[2]);
  t.ndim = int(nb::len(shape));
  for (int i = 0; i < t.ndim && i < flash_kda::kMaxTensorRank; ++i) {
    t.shape[i] = nb::cast<int64_t>(shape[size_t(i)]);
    t.strides[i] = nb::cast<int64_t>(strides[size_t(i)]);
  }
  const std::string device = nb::cast<std::string>(d[3]);
  if (device == "cpu") {
    t.device = Device::kHost;
  } else if (device == "cuda") {
    t.device = Device::kCuda;
    t.device_id = nb::cast<int>(d[4]);
  } else if (device == "meta") {
    t.device = Device::kMeta;
  } else {
    t.device = Device::kOther;
    t.device_text = device;
  }
  return t;
}

// Runs `call` on the GPU the arrays live on (the caller's current device may be another one) with
// the GIL released.
template <typename Call>
Status run_on_device(Backend backend, int device, const Call& call) {
  nb::gil_scoped_release release;
#ifdef FLASH_KDA_WITH_CUDA
  int current = 0;
  if (backend == Backend::kCuda && cudaGetDevice(&current) == cudaSuccess && current != device) {
    if (cudaSetDevice(device) != cudaSuccess)
      return {StatusCode::kCudaError, cat("q: cannot make CUDA device ", device, " current")};
    const Status s = call();
    cudaSetDevice(current);
    return s;
  }
#endif
  return call();
}

// ---- the entry points ---------------------------------------------------------------------------------

// Argument positions of bf16_bits / read_only (the order of fwd's and decode's arrays).
enum Position {
  kQ,
  kK,
  kV,
  kG,
  kBeta,
  kOut,
  kALog,
  kDtBias,
  kCu,
  kCuCpu,
  kState1,
  kState2,
  kIdx,
  kFlag,
  kCheckpointState,
  kCheckpointIndices,
  kCheckpointStart
};

void fill_call_args(flash_kda::CallArgs& c, const OptArray& q, const OptArray& k, const OptArray& v, const OptArray& g,
                    const OptArray& beta, nb::handle scale, const OptArray& out, const OptArray& A_log,
                    const OptArray& dt_bias, nb::handle lower_bound, const OptArray& cu_seqlens,
                    const OptArray& cu_seqlens_cpu, const std::string& backend, int cpu_threads, uint64_t bf16,
                    uint64_t ro) {
  c.q = describe(q, kQ, bf16, ro);
  c.k = describe(k, kK, bf16, ro);
  c.v = describe(v, kV, bf16, ro);
  c.g = describe(g, kG, bf16, ro);
  c.beta = describe(beta, kBeta, bf16, ro);
  c.out = describe(out, kOut, bf16, ro);
  c.A_log = describe(A_log, kALog, bf16, ro);
  c.dt_bias = describe(dt_bias, kDtBias, bf16, ro);
  c.cu_seqlens = describe(cu_seqlens, kCu, bf16, ro);
  c.cu_seqlens_cpu = describe(cu_seqlens_cpu, kCuCpu, bf16, ro);
  c.scale = real_number("scale", scale);
  set_lower_bound(c, lower_bound);
  c.backend = backend;
  c.cpu_threads = cpu_threads;
}

// Runs the forward; with run=false, converts and validates only (host_overhead.py --dry).
void fwd(const OptArray& q, const OptArray& k, const OptArray& v, const OptArray& g, const OptArray& beta,
         nb::handle scale, const OptArray& out, const OptArray& A_log, const OptArray& dt_bias, nb::handle lower_bound,
         const OptArray& initial_state, const OptArray& final_state, const OptArray& cu_seqlens,
         const OptArray& cu_seqlens_cpu, const OptArray& state_indices, const OptArray& has_initial_state,
         const OptArray& checkpoint_state, const OptArray& checkpoint_indices, const OptArray& checkpoint_start,
         nb::handle checkpoint_interval, const std::string& backend, uintptr_t stream, int cpu_threads,
         uint64_t bf16_bits, uint64_t read_only, nb::object allocate, bool run, bool allow_neg_eigval) {
  FwdArgs a;
  fill_call_args(a, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, cu_seqlens, cu_seqlens_cpu, backend,
                 cpu_threads, bf16_bits, read_only);
  a.allow_neg_eigval = allow_neg_eigval;
  a.initial_state = describe(initial_state, kState1, bf16_bits, read_only);
  a.final_state = describe(final_state, kState2, bf16_bits, read_only);
  a.state_indices = describe(state_indices, kIdx, bf16_bits, read_only);
  a.has_initial_state = describe(has_initial_state, kFlag, bf16_bits, read_only);
  a.checkpoint_state = describe(checkpoint_state, kCheckpointState, bf16_bits, read_only);
  a.checkpoint_indices = describe(checkpoint_indices, kCheckpointIndices, bf16_bits, read_only);
  a.checkpoint_start = describe(checkpoint_start, kCheckpointStart, bf16_bits, read_only);
  a.checkpoint_interval = optional_integer("checkpoint_interval", checkpoint_interval);
  FwdParams p;
  int device = 0;
  raise_status(flash_kda::fwd_params(a, &p, &device));

  // Scratch memory, when the call needs some: allocate(nbytes) returns a DLPack array on the
  // arrays' device (torch's caching allocator: stream-ordered, usable under graph capture).
  const size_t needed = flash_kda::workspace_size(p);
  std::optional<Array> workspace;
  if (needed > 0 && !allocate.is_none()) {
    workspace = nb::cast<Array>(allocate(needed));
    if (workspace->nbytes() < needed ||
        (p.backend == Backend::kCuda &&
         (workspace->device_type() != nb::device::cuda::value || workspace->device_id() != device)))
      raise(PyExc_RuntimeError, "workspace: allocate() returned too small an array or one on another device");
    p.workspace = const_cast<void*>(workspace->data());
    p.workspace_bytes = workspace->nbytes();
  }
  if (!run) {
    raise_status(flash_kda::validate(p));
    return;
  }
  // The arrays stay alive in this frame's arguments while other Python threads run.
  raise_status(
      run_on_device(p.backend, device, [&] { return flash_kda::fwd(p, reinterpret_cast<cudaStream_t>(stream)); }));
}

void decode(const OptArray& q, const OptArray& k, const OptArray& v, const OptArray& g, const OptArray& beta,
            nb::handle scale, const OptArray& out, const OptArray& A_log, const OptArray& dt_bias,
            nb::handle lower_bound, const OptArray& state, const OptArray& state_indices,
            const OptArray& num_accepted_tokens, const OptArray& cu_seqlens, const OptArray& cu_seqlens_cpu,
            const std::string& backend, uintptr_t stream, int cpu_threads, uint64_t bf16_bits, uint64_t read_only,
            bool allow_neg_eigval) {
  DecodeArgs a;
  fill_call_args(a, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, cu_seqlens, cu_seqlens_cpu, backend,
                 cpu_threads, bf16_bits, read_only);
  a.allow_neg_eigval = allow_neg_eigval;
  a.state = describe(state, kState1, bf16_bits, read_only);
  a.state_indices = describe(state_indices, kIdx, bf16_bits, read_only);
  a.num_accepted_tokens = describe(num_accepted_tokens, kFlag, bf16_bits, read_only);
  DecodeParams p;
  int device = 0;
  raise_status(flash_kda::decode_params(a, &p, &device));
  raise_status(
      run_on_device(p.backend, device, [&] { return flash_kda::decode(p, reinterpret_cast<cudaStream_t>(stream)); }));
}

void meta_call_args(flash_kda::CallArgs& c, nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta,
                    nb::handle scale, nb::handle out, nb::handle A_log, nb::handle dt_bias, nb::handle lower_bound,
                    nb::handle cu_seqlens, nb::handle cu_seqlens_cpu, const std::string& backend) {
  c.q = describe_meta(q, kQ);
  c.k = describe_meta(k, kK);
  c.v = describe_meta(v, kV);
  c.g = describe_meta(g, kG);
  c.beta = describe_meta(beta, kBeta);
  c.out = describe_meta(out, kOut);
  c.A_log = describe_meta(A_log, kALog);
  c.dt_bias = describe_meta(dt_bias, kDtBias);
  c.cu_seqlens = describe_meta(cu_seqlens, kCu);
  c.cu_seqlens_cpu = describe_meta(cu_seqlens_cpu, kCuCpu);
  c.scale = real_number("scale", scale);
  set_lower_bound(c, lower_bound);
  c.backend = backend;
}

void check_fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, nb::handle scale,
               nb::handle out, nb::handle A_log, nb::handle dt_bias, nb::handle lower_bound, nb::handle initial_state,
               nb::handle final_state, nb::handle cu_seqlens, nb::handle cu_seqlens_cpu, nb::handle state_indices,
               nb::handle has_initial_state, nb::handle checkpoint_state, nb::handle checkpoint_indices,
               nb::handle checkpoint_start, nb::handle checkpoint_interval, const std::string& backend,
               bool allow_neg_eigval) {
  FwdArgs a;
  meta_call_args(a, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, cu_seqlens, cu_seqlens_cpu, backend);
  a.allow_neg_eigval = allow_neg_eigval;
  a.initial_state = describe_meta(initial_state, kState1);
  a.final_state = describe_meta(final_state, kState2);
  a.state_indices = describe_meta(state_indices, kIdx);
  a.has_initial_state = describe_meta(has_initial_state, kFlag);
  a.checkpoint_state = describe_meta(checkpoint_state, kCheckpointState);
  a.checkpoint_indices = describe_meta(checkpoint_indices, kCheckpointIndices);
  a.checkpoint_start = describe_meta(checkpoint_start, kCheckpointStart);
  a.checkpoint_interval = optional_integer("checkpoint_interval", checkpoint_interval);
  raise_status(flash_kda::check_fwd(a));
}

void check_decode(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, nb::handle scale,
                  nb::handle out, nb::handle A_log, nb::handle dt_bias, nb::handle lower_bound, nb::handle state,
                  nb::handle state_indices, nb::handle num_accepted_tokens, nb::handle cu_seqlens,
                  nb::handle cu_seqlens_cpu, const std::string& backend, bool allow_neg_eigval) {
  DecodeArgs a;
  meta_call_args(a, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, cu_seqlens, cu_seqlens_cpu, backend);
  a.allow_neg_eigval = allow_neg_eigval;
  a.state = describe_meta(state, kState1);
  a.state_indices = describe_meta(state_indices, kIdx);
  a.num_accepted_tokens = describe_meta(num_accepted_tokens, kFlag);
  raise_status(flash_kda::check_decode(a));
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flash-kda: the compiled Kimi Delta Attention forward (use the flash_kda package instead)";

  auto arr = [](const char* name) { return nb::arg(name).noconvert().none(); };
  auto opt = [](const char* name) { return nb::arg(name).noconvert().none() = nb::none(); };
  m.def("fwd", &fwd, arr("q"), arr("k"), arr("v"), arr("g"), arr("beta"), nb::arg("scale").none(), arr("out"),
        arr("A_log"), arr("dt_bias"), nb::arg("lower_bound").none(), opt("initial_state"), opt("final_state"),
        opt("cu_seqlens"), opt("cu_seqlens_cpu"), opt("state_indices"), opt("has_initial_state"),
        opt("checkpoint_state"), opt("checkpoint_indices"), opt("checkpoint_start"), nb::kw_only(),
        nb::arg("checkpoint_interval").none() = nb::none(), nb::arg("backend") = "auto", nb::arg("stream") = 0,
        nb::arg("cpu_threads") = 0, nb::arg("bf16_bits") = 0, nb::arg("read_only") = 0,
        nb::arg("allocate").none() = nb::none(), nb::arg("run") = true, nb::arg("allow_neg_eigval") = false,
        "Runs the KDA forward in place on DLPack arrays. lower_bound None: the softplus gate; A_log None (with "
        "a lower_bound): rate 1. backend: 'auto' (where the arrays live), 'cuda', "
        "'cpu' or 'reference'. stream: a cudaStream_t as an integer (0: the legacy default stream). "
        "bf16_bits / read_only: bit i set when array argument i (in this order) is bf16 passed as 16-bit "
        "integers / may not be written. allocate(nbytes): returns scratch memory when the call needs some. "
        "run=False: convert and validate only.");

  m.def("decode", &decode, arr("q"), arr("k"), arr("v"), arr("g"), arr("beta"), nb::arg("scale").none(), arr("out"),
        arr("A_log"), arr("dt_bias"), nb::arg("lower_bound").none(), arr("state"), arr("state_indices"),
        opt("num_accepted_tokens"), opt("cu_seqlens"), opt("cu_seqlens_cpu"), nb::kw_only(),
        nb::arg("backend") = "auto", nb::arg("stream") = 0, nb::arg("cpu_threads") = 0, nb::arg("bf16_bits") = 0,
        nb::arg("read_only") = 0, nb::arg("allow_neg_eigval") = false,
        "Runs one decode step (1 to 8 tokens per sequence) in place on DLPack arrays: writes out and the pool "
        "`state` [P, HV, V, K] through int32 state_indices [N] or [N, S] (docs/serving.md). Options as for fwd; "
        "the bit positions of state, state_indices, num_accepted_tokens are those of initial_state, "
        "state_indices, has_initial_state in fwd.");

  auto meta = [](const char* name) { return nb::arg(name).none() = nb::none(); };
  m.def("check_fwd", &check_fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("scale").none(), nb::arg("out"), nb::arg("A_log").none(), nb::arg("dt_bias"),
        nb::arg("lower_bound").none(),
        meta("initial_state"), meta("final_state"), meta("cu_seqlens"), meta("cu_seqlens_cpu"), meta("state_indices"),
        meta("has_initial_state"), meta("checkpoint_state"), meta("checkpoint_indices"), meta("checkpoint_start"),
        nb::kw_only(), nb::arg("checkpoint_interval").none() = nb::none(), nb::arg("backend") = "auto",
        nb::arg("allow_neg_eigval") = false,
        "Every check of fwd that needs no data, on tensor descriptions (dtype, shape, strides, device type, "
        "device index) or None: what torch's fake implementations run.");
  m.def("check_decode", &check_decode, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("scale").none(), nb::arg("out"), nb::arg("A_log").none(), nb::arg("dt_bias"),
        nb::arg("lower_bound").none(),
        nb::arg("state"), nb::arg("state_indices"), meta("num_accepted_tokens"), meta("cu_seqlens"),
        meta("cu_seqlens_cpu"), nb::kw_only(), nb::arg("backend") = "auto", nb::arg("allow_neg_eigval") = false,
        "Every check of decode that needs no data (as check_fwd).");

  m.def("cuda_available", &flash_kda::cuda_available,
        "True when this build has the CUDA kernels and a compute capability 9.0 device is present.");

#ifdef FLASH_KDA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
