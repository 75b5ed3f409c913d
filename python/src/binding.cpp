// flash_kda._C: the nanobind layer between Python arrays and the C++ API.
//
// It only translates: each array (a torch tensor, host or CUDA; a NumPy array; a DLPack capsule)
// becomes a tensor description (src/api/tensors.h), the C++ contract layer turns those into one
// FwdParams (or DecodeParams) and checks them, flash_kda::fwd (or decode) runs with the GIL
// released, and a Status that is not ok becomes a Python exception. No argument is checked here:
// every rule lives in src/api. check_fwd / check_decode take descriptions without data (torch's
// fake tensors). How an eager call's arrays come in, and what it costs: docs/torch.md, "Host overhead".
//
// Status codes map to exceptions as follows:
//   kInvalidArgument -> ValueError          kTypeMismatch -> TypeError
//   kUnsupported     -> NotImplementedError (a subclass of RuntimeError)
//   kCudaError       -> RuntimeError
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
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
  kCheckpointStart,
  kPositions
};

// ---- arrays -> tensor descriptions ---------------------------------------------------------------

// The DLPack C exchange API (DLPack 1.2 and later): a framework's tensor type carries a capsule
// `__dlpack_c_exchange_api__` whose C functions describe one of its tensors as a DLTensor without
// creating any Python object, and give the framework's current stream of a device (torch.Tensor has
// it since torch 2.10). The structs below mirror that ABI (DLPack's dlpack.h).
namespace dl {
struct Device {
  int32_t type, id;
};
struct DataType {
  uint8_t code, bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct Version {
  uint32_t major, minor;
};
struct ApiHeader {
  Version version;
  ApiHeader* prev_api;
};
struct ExchangeApi {
  ApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);  // may be null
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};
constexpr int32_t kCpu = 1, kCuda = 2;
}  // namespace dl

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

// The description of a DLPack tensor (a DLTensor or a nanobind ndarray's fields).
void describe_dl(TensorArg& t, const void* data, const nb::dlpack::dtype& dtype, int ndim, const int64_t* shape,
                 const int64_t* strides, int32_t device_type, int32_t device_id, bool bf16, bool read_only) {
  t.given = true;
  t.data = data;
  set_dtype(t, dtype, bf16);
  t.ndim = ndim;
  const int rank = std::min(ndim, flash_kda::kMaxTensorRank);
  int64_t contiguous = 1;  // strides may be absent (DLPack before 1.2: contiguous)
  for (int i = rank; i-- > 0;) {
    t.shape[i] = shape[i];
    t.strides[i] = strides ? strides[i] : contiguous;
    contiguous *= shape[i];
  }
  if (device_type == dl::kCpu) {
    t.device = Device::kHost;
  } else if (device_type == dl::kCuda) {
    t.device = Device::kCuda;
    t.device_id = device_id;
  } else {
    t.device = Device::kOther;
    t.device_text = cat("DLPack device type ", device_type);
  }
  t.read_only = read_only;
}

// How instances of a type convert on the short way: torch's exchange API and the type's is_neg
// (looked up once: calling it costs no attribute lookup), or api null (the general way). Only the
// API of torch.Tensor itself qualifies (torch.Tensor and the subclasses that inherit it, e.g.
// nn.Parameter): a type with its own (torch's read-only wrapper, another framework) takes the
// general way.
struct ShortWay {
  const dl::ExchangeApi* api = nullptr;
  PyObject* is_neg = nullptr;  // the type's is_neg (an unbound method)
};

ShortWay lookup_short_way(PyTypeObject* type) {
  ShortWay way;
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (!capsule) {
    PyErr_Clear();
    return way;
  }
  PyObject* modules = PySys_GetObject("modules");  // borrowed
  PyObject* torch = modules ? PyDict_GetItemString(modules, "torch") : nullptr;
  PyObject* tensor = torch ? PyObject_GetAttrString(torch, "Tensor") : nullptr;
  PyObject* torch_capsule = tensor ? PyObject_GetAttrString(tensor, "__dlpack_c_exchange_api__") : nullptr;
  if (torch_capsule == capsule && PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
    auto* candidate = static_cast<const dl::ExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
    // The table's layout is DLPack 1.x's from minor version 2 on.
    const dl::ApiHeader* h = candidate ? &candidate->header : nullptr;
    while (h && h->version.major > 1) h = h->prev_api;
    if (h && h->version.major == 1 && h->version.minor >= 2) {
      candidate = reinterpret_cast<const dl::ExchangeApi*>(h);
      PyObject* is_neg = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "is_neg");
      if (candidate->dltensor_from_py_object_no_sync && candidate->current_work_stream && is_neg) {
        way.api = candidate;
        way.is_neg = is_neg;  // kept, as the type is
      } else {
        Py_XDECREF(is_neg);
      }
    }
  }
  PyErr_Clear();
  Py_XDECREF(torch_capsule);
  Py_XDECREF(tensor);
  Py_DECREF(capsule);
  return way;
}

// Looked up once per type; the types are kept alive, so that their addresses stay theirs.
ShortWay short_way_of(PyTypeObject* type) {
  struct Entry {
    PyTypeObject* type;
    ShortWay way;
  };
  static Entry cache[16];
  static int cached = 0;
  for (int i = 0; i < cached; ++i)
    if (cache[i].type == type) return cache[i].way;
  const ShortWay way = lookup_short_way(type);
  if (cached < int(std::size(cache))) {
    Py_INCREF(reinterpret_cast<PyObject*>(type));
    cache[cached++] = {type, way};
  } else {
    Py_XDECREF(way.is_neg);  // not cached: looked up again next time
    return {};
  }
  return way;
}

// flash_kda._arrays.<name> and flash_kda._eager.<name>: the Python side of the general way, looked up
// once (and never released: they live as long as the interpreter).
PyObject* package_function(const char* module, const char* name) {
  PyObject* m = PyImport_ImportModule(module);
  if (!m) throw nb::python_error();
  PyObject* f = PyObject_GetAttrString(m, name);
  Py_DECREF(m);
  if (!f) throw nb::python_error();
  return f;
}

// Converts the array arguments of one call. A torch tensor whose type has torch's exchange API and
// no negative bit is described straight from the DLTensor that API fills (no Python object is made;
// the caller's arguments keep the tensors alive for the call). Everything else (NumPy arrays, other
// tensors, tensors with the negative bit, tensors DLPack cannot describe) goes the general way:
// flash_kda._arrays.export_one gives a DLPack capsule or a NumPy array (and says whether it holds
// bf16 bits or may not be written), or raises an error naming the argument; that object is kept for
// the call. Neither way checks anything the C++ contract layer checks.
class Arrays {
 public:
  Arrays(uint64_t bf16_bits, uint64_t read_only) : bf16_bits_(bf16_bits), read_only_(read_only) {}
  Arrays(const Arrays&) = delete;
  Arrays& operator=(const Arrays&) = delete;

  // Describes argument `index` (None: not given) in `t`, a default TensorArg.
  void get(TensorArg& t, nb::handle h, int index, const char* name) {
    if (h.is_none()) return;
    PyObject* o = h.ptr();
    const ShortWay way = short_way_of(Py_TYPE(o));
    if (way.api && short_way(way, o, index, t)) {
      if (index == 0) q_api = way.api;
      return;
    }
    general_way(o, index, name, t);
  }

  // The exchange API q came through (its current_work_stream gives the stream), or null.
  const dl::ExchangeApi* q_api = nullptr;

  // The short way alone (_C.reads_directly): false leaves no Python error set.
  bool short_way_for(const ShortWay& way, PyObject* o, TensorArg& t) { return short_way(way, o, 0, t); }

 private:
  bool bit(uint64_t mask, int index) const { return (mask >> index) & 1; }

  bool short_way(const ShortWay& way, PyObject* o, int index, TensorArg& t) {
    PyObject* neg = PyObject_Vectorcall(way.is_neg, &o, 1, nullptr);
    const bool plain = neg == Py_False;
    Py_XDECREF(neg);
    dl::Tensor d{};
    if (!plain || way.api->dltensor_from_py_object_no_sync(o, &d) != 0) {
      PyErr_Clear();  // the general way resolves the bit, or raises the error naming the argument
      return false;
    }
    const nb::dlpack::dtype dtype{d.dtype.code, d.dtype.bits, d.dtype.lanes};
    describe_dl(t, static_cast<const char*>(d.data) + d.byte_offset, dtype, d.ndim, d.shape, d.strides, d.device.type,
                d.device.id, bit(bf16_bits_, index), bit(read_only_, index));
    return true;
  }

  void general_way(PyObject* o, int index, const char* name, TensorArg& t) {
    if (PyCapsule_CheckExact(o)) {  // a DLPack capsule as it is (consumed: used once)
      keep_[index] = nb::borrow(o);
      return import(index, name, t, false, false);
    }
    static PyObject* export_one = package_function("flash_kda._arrays", "export_one");
    nb::object py_name = nb::steal(PyUnicode_FromString(name));
    nb::object py_bit = nb::steal(PyLong_FromUnsignedLongLong(uint64_t(1) << index));
    if (!py_name.is_valid() || !py_bit.is_valid()) throw nb::python_error();
    PyObject* args[] = {py_name.ptr(), o, py_bit.ptr()};
    nb::object r = nb::steal(PyObject_Vectorcall(export_one, args, 3, nullptr));
    if (!r.is_valid()) throw nb::python_error();
    const nb::tuple converted = nb::cast<nb::tuple>(r);
    const bool bf16 = nb::cast<uint64_t>(converted[1]) != 0, ro = nb::cast<uint64_t>(converted[2]) != 0;
    keep_[index] = converted[0];
    import(index, name, t, bf16, ro);
  }

  // keep_[index] (a capsule or a NumPy array) through nanobind's DLPack import.
  void import(int index, const char* name, TensorArg& t, bool bf16, bool ro) {
    Array a;
    if (!nb::try_cast<Array>(keep_[index], a, false))
      raise(PyExc_TypeError, cat(name, ": cannot be passed as an array (DLPack cannot describe it)"));
    arrays_[index] = a;
    describe_dl(t, a.data(), a.dtype(), int(a.ndim()), a.shape_ptr(), a.stride_ptr(), a.device_type(), a.device_id(),
                bit(bf16_bits_, index) || bf16, bit(read_only_, index) || ro);
  }

  uint64_t bf16_bits_, read_only_;
  nb::object keep_[kPositions];
  std::optional<Array> arrays_[kPositions];
};

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

// backend: None ("auto": where the arrays live) or a string; anything else goes on as its repr,
// which src/api rejects by name.
std::string backend_name(nb::handle h) {
  if (h.is_none()) return "auto";
  if (PyUnicode_Check(h.ptr())) return nb::cast<std::string>(h);
  return nb::cast<std::string>(nb::repr(h));
}

bool truth(nb::handle h) {
  const int r = PyObject_IsTrue(h.ptr());
  if (r < 0) throw nb::python_error();
  return r != 0;
}

void fill_call_args(flash_kda::CallArgs& c, Arrays& arrays, nb::handle q, nb::handle k, nb::handle v, nb::handle g,
                    nb::handle beta, nb::handle scale, nb::handle out, nb::handle A_log, nb::handle dt_bias,
                    nb::handle lower_bound, nb::handle cu_seqlens, nb::handle cu_seqlens_cpu, nb::handle backend,
                    int cpu_threads, nb::handle allow_neg_eigval) {
  arrays.get(c.q, q, kQ, "q");
  arrays.get(c.k, k, kK, "k");
  arrays.get(c.v, v, kV, "v");
  arrays.get(c.g, g, kG, "g");
  arrays.get(c.beta, beta, kBeta, "beta");
  arrays.get(c.out, out, kOut, "out");
  arrays.get(c.A_log, A_log, kALog, "A_log");
  arrays.get(c.dt_bias, dt_bias, kDtBias, "dt_bias");
  arrays.get(c.cu_seqlens, cu_seqlens, kCu, "cu_seqlens");
  arrays.get(c.cu_seqlens_cpu, cu_seqlens_cpu, kCuCpu, "cu_seqlens_cpu");
  c.scale = real_number("scale", scale);
  set_lower_bound(c, lower_bound);
  c.backend = backend_name(backend);
  c.cpu_threads = cpu_threads;
  c.allow_neg_eigval = truth(allow_neg_eigval);
}

// The stream a CUDA call runs on: `stream` when given (a cudaStream_t as an integer), else the
// current stream of the arrays' device as torch has it: through the exchange API when q came that
// way, else flash_kda._eager.current_stream(device) (0, the legacy default stream, without torch).
uintptr_t stream_for(const Arrays& arrays, nb::handle stream, int device) {
  if (!stream.is_none()) return nb::cast<uintptr_t>(stream);
  if (arrays.q_api) {
    void* s = nullptr;
    if (arrays.q_api->current_work_stream(dl::kCuda, device, &s) != 0) throw nb::python_error();
    return reinterpret_cast<uintptr_t>(s);
  }
  static PyObject* current_stream = package_function("flash_kda._eager", "current_stream");
  return nb::cast<uintptr_t>(nb::steal(PyObject_CallFunction(current_stream, "i", device)));
}

// Runs the forward; with run=false, converts and validates only (host_overhead.py --dry).
void fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, nb::handle scale, nb::handle out,
         nb::handle A_log, nb::handle dt_bias, nb::handle lower_bound, nb::handle initial_state, nb::handle final_state,
         nb::handle cu_seqlens, nb::handle cu_seqlens_cpu, nb::handle state_indices, nb::handle has_initial_state,
         nb::handle checkpoint_state, nb::handle checkpoint_indices, nb::handle checkpoint_start,
         nb::handle checkpoint_interval, nb::handle backend, nb::handle allow_neg_eigval, nb::handle stream,
         int cpu_threads, uint64_t bf16_bits, uint64_t read_only, nb::handle allocate, bool run) {
  Arrays arrays(bf16_bits, read_only);
  FwdArgs a;
  fill_call_args(a, arrays, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, cu_seqlens, cu_seqlens_cpu,
                 backend, cpu_threads, allow_neg_eigval);
  arrays.get(a.initial_state, initial_state, kState1, "initial_state");
  arrays.get(a.final_state, final_state, kState2, "final_state");
  arrays.get(a.state_indices, state_indices, kIdx, "state_indices");
  arrays.get(a.has_initial_state, has_initial_state, kFlag, "has_initial_state");
  arrays.get(a.checkpoint_state, checkpoint_state, kCheckpointState, "checkpoint_state");
  arrays.get(a.checkpoint_indices, checkpoint_indices, kCheckpointIndices, "checkpoint_indices");
  arrays.get(a.checkpoint_start, checkpoint_start, kCheckpointStart, "checkpoint_start");
  a.checkpoint_interval = optional_integer("checkpoint_interval", checkpoint_interval);
  FwdParams p;
  int device = 0;
  raise_status(flash_kda::fwd_params(a, &p, &device));

  // Scratch memory, only when the call needs some: allocate(nbytes, device) returns a DLPack array
  // on the arrays' device; by default flash_kda._eager.workspace (torch's caching allocator:
  // stream-ordered, usable under graph capture).
  const size_t needed = flash_kda::workspace_size(p);
  std::optional<Array> workspace;
  nb::object workspace_owner;
  if (needed > 0) {
    static PyObject* default_allocate = package_function("flash_kda._eager", "workspace");
    PyObject* f = allocate.is_none() ? default_allocate : allocate.ptr();
    workspace_owner = nb::steal(PyObject_CallFunction(f, "ni", Py_ssize_t(needed), device));
    if (!workspace_owner.is_valid()) throw nb::python_error();
    if (!workspace_owner.is_none()) {
      workspace = nb::cast<Array>(workspace_owner);
      if (workspace->nbytes() < needed ||
          (p.backend == Backend::kCuda &&
           (workspace->device_type() != nb::device::cuda::value || workspace->device_id() != device)))
        raise(PyExc_RuntimeError, "workspace: allocate() returned too small an array or one on another device");
      p.workspace = const_cast<void*>(workspace->data());
      p.workspace_bytes = workspace->nbytes();
    }
  }
  if (!run) {
    raise_status(flash_kda::validate(p));
    return;
  }
  const uintptr_t s = p.backend == Backend::kCuda ? stream_for(arrays, stream, device) : 0;
  // The arrays stay alive in this frame's arguments and in `arrays` while other Python threads run.
  raise_status(run_on_device(p.backend, device, [&] { return flash_kda::fwd(p, reinterpret_cast<cudaStream_t>(s)); }));
}

void decode(nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta, nb::handle scale, nb::handle out,
            nb::handle A_log, nb::handle dt_bias, nb::handle lower_bound, nb::handle state, nb::handle state_indices,
            nb::handle num_accepted_tokens, nb::handle cu_seqlens, nb::handle cu_seqlens_cpu, nb::handle backend,
            nb::handle allow_neg_eigval, nb::handle stream, int cpu_threads, uint64_t bf16_bits, uint64_t read_only) {
  Arrays arrays(bf16_bits, read_only);
  DecodeArgs a;
  fill_call_args(a, arrays, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, cu_seqlens, cu_seqlens_cpu,
                 backend, cpu_threads, allow_neg_eigval);
  arrays.get(a.state, state, kState1, "state");
  arrays.get(a.state_indices, state_indices, kIdx, "state_indices");
  arrays.get(a.num_accepted_tokens, num_accepted_tokens, kFlag, "num_accepted_tokens");
  DecodeParams p;
  int device = 0;
  raise_status(flash_kda::decode_params(a, &p, &device));
  const uintptr_t s = p.backend == Backend::kCuda ? stream_for(arrays, stream, device) : 0;
  raise_status(
      run_on_device(p.backend, device, [&] { return flash_kda::decode(p, reinterpret_cast<cudaStream_t>(s)); }));
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

  auto arr = [](const char* name) { return nb::arg(name).none(); };
  auto opt = [](const char* name) { return nb::arg(name).none() = nb::none(); };
  m.def("fwd", &fwd, arr("q"), arr("k"), arr("v"), arr("g"), arr("beta"), arr("scale"), arr("out"), arr("A_log"),
        arr("dt_bias"), arr("lower_bound"), opt("initial_state"), opt("final_state"), opt("cu_seqlens"),
        opt("cu_seqlens_cpu"), opt("state_indices"), opt("has_initial_state"), opt("checkpoint_state"),
        opt("checkpoint_indices"), opt("checkpoint_start"), opt("checkpoint_interval"), opt("backend"),
        nb::arg("allow_neg_eigval").none() = false, nb::kw_only(), opt("stream"), nb::arg("cpu_threads") = 0,
        nb::arg("bf16_bits") = 0, nb::arg("read_only") = 0, opt("allocate"), nb::arg("run") = true,
        "Runs the KDA forward in place on arrays (torch tensors, NumPy arrays, DLPack capsules). lower_bound "
        "None: the softplus gate; A_log None (with a lower_bound): rate 1. backend: None or 'auto' (where the "
        "arrays live), 'cuda', 'cpu' or 'reference'. stream: a cudaStream_t as an integer (None: torch's current "
        "stream of the arrays' device). bf16_bits / read_only: bit i set when array argument i (in this order) is "
        "bf16 passed as 16-bit integers / may not be written. allocate(nbytes, device): returns scratch memory "
        "when the call needs some (None: torch's allocator). run=False: convert and validate only.");

  m.def("decode", &decode, arr("q"), arr("k"), arr("v"), arr("g"), arr("beta"), arr("scale"), arr("out"), arr("A_log"),
        arr("dt_bias"), arr("lower_bound"), arr("state"), arr("state_indices"), opt("num_accepted_tokens"),
        opt("cu_seqlens"), opt("cu_seqlens_cpu"), opt("backend"), nb::arg("allow_neg_eigval").none() = false,
        nb::kw_only(), opt("stream"), nb::arg("cpu_threads") = 0, nb::arg("bf16_bits") = 0, nb::arg("read_only") = 0,
        "Runs one decode step (1 to 8 tokens per sequence) in place: writes out and the pool `state` "
        "[P, HV, V, K] through int32 state_indices [N] or [N, S] (docs/serving.md). Options as for fwd; "
        "the bit positions of state, state_indices, num_accepted_tokens are those of initial_state, "
        "state_indices, has_initial_state in fwd.");

  auto meta = [](const char* name) { return nb::arg(name).none() = nb::none(); };
  m.def("check_fwd", &check_fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("scale").none(), nb::arg("out"), nb::arg("A_log").none(), nb::arg("dt_bias"),
        nb::arg("lower_bound").none(), meta("initial_state"), meta("final_state"), meta("cu_seqlens"),
        meta("cu_seqlens_cpu"), meta("state_indices"), meta("has_initial_state"), meta("checkpoint_state"),
        meta("checkpoint_indices"), meta("checkpoint_start"), nb::kw_only(),
        nb::arg("checkpoint_interval").none() = nb::none(), nb::arg("backend") = "auto",
        nb::arg("allow_neg_eigval") = false,
        "Every check of fwd that needs no data, on tensor descriptions (dtype, shape, strides, device type, "
        "device index) or None: what torch's fake implementations run.");
  m.def("check_decode", &check_decode, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("scale").none(), nb::arg("out"), nb::arg("A_log").none(), nb::arg("dt_bias"),
        nb::arg("lower_bound").none(), nb::arg("state"), nb::arg("state_indices"), meta("num_accepted_tokens"),
        meta("cu_seqlens"), meta("cu_seqlens_cpu"), nb::kw_only(), nb::arg("backend") = "auto",
        nb::arg("allow_neg_eigval") = false, "Every check of decode that needs no data (as check_fwd).");

  m.def(
      "reads_directly",
      [](nb::handle h) {
        if (h.is_none()) return false;
        const ShortWay way = short_way_of(Py_TYPE(h.ptr()));
        if (!way.api) return false;
        TensorArg t;
        Arrays arrays(0, 0);
        return arrays.short_way_for(way, h.ptr(), t);
      },
      nb::arg("array").none(),
      "True when fwd / decode read this array themselves (torch's DLPack C exchange API), False when it "
      "goes through flash_kda._arrays.export_one (docs/torch.md, \"Host overhead\").");

  m.def("cuda_available", &flash_kda::cuda_available,
        "True when this build has the CUDA kernels and a compute capability 9.0 device is present.");

#ifdef FLASH_KDA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
