"""fwd: argument checks, then one call into the compiled library (flash_kda._C).

Everything a caller can get wrong is checked here, before any buffer is written, and reported as
TypeError (a dtype) or ValueError (a shape, stride, device or value) whose message starts with the
argument's name. The compiled layer repeats the checks memory safety depends on, and the C++ API
checks the rest (the range of lower_bound, the contents of host cu_seqlens, pointer alignment).

torch tensors take a shorter route (flash_kda.torch_ops): they are handed to the compiled layer
directly, which checks everything this module checks except the contents of CUDA cu_seqlens; only
when it rejects a call are the checks below run, so that the error message is the same on both
routes. Under torch.compile, FakeTensor or other torch dispatch modes the call becomes the custom
operator torch.ops.flash_kda.fwd.
"""

from __future__ import annotations

import math
import sys

import ml_dtypes
import numpy as np

from . import _C

_BF16 = np.dtype(ml_dtypes.bfloat16)
_NUMPY_DTYPES = {
    _BF16: "bf16",
    np.dtype(np.float32): "fp32",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
}
_BACKENDS = (None, "cuda", "cpu", "reference")


def _first_torch_call(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state,
                      final_state, cu_seqlens, backend, cu_seqlens_cpu, state_indices, has_initial_state):
    """The route of a call whose q is not a NumPy array until flash_kda.torch_ops is loaded: loads
    it (registering the custom operators; it then replaces _TORCH_FWD by its fwd_torch) when torch
    is imported, else takes the checked route (no argument can be a torch tensor)."""
    args = (q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
            cu_seqlens, backend, cu_seqlens_cpu, state_indices, has_initial_state)
    if sys.modules.get("torch") is None:
        return _fwd_checked(*args)
    from . import torch_ops  # a plain import statement, which torch.compile can trace

    return torch_ops.fwd_torch(*args)


# The route of torch tensors (and anything else that is not a NumPy array): _first_torch_call, then
# flash_kda.torch_ops.fwd_torch. Always a function (torch.compile guards on it).
_TORCH_FWD = _first_torch_call


def _torch():
    """The torch module if the caller has imported it (this package never imports it itself)."""
    return sys.modules.get("torch")


class _Array:
    """What the checks need to know about one NumPy array or torch tensor, in one vocabulary."""

    __slots__ = ("name", "obj", "is_torch", "dtype", "shape", "strides", "device", "writeable")

    def __init__(self, name, obj):
        self.name = name
        self.obj = obj
        torch = _torch()
        if isinstance(obj, np.ndarray):
            self.is_torch = False
            self.dtype = _NUMPY_DTYPES.get(obj.dtype) or str(obj.dtype)
            self.shape = tuple(obj.shape)
            itemsize = obj.dtype.itemsize
            if any(s % itemsize for s in obj.strides):
                raise ValueError(f"{name}: strides {obj.strides} are not multiples of the element size")
            self.strides = tuple(s // itemsize for s in obj.strides)
            self.device = "cpu"
            self.writeable = obj.flags.writeable
        elif torch is not None and isinstance(obj, torch.Tensor):
            self.is_torch = True
            self.dtype = {
                torch.bfloat16: "bf16",
                torch.float32: "fp32",
                torch.int32: "int32",
                torch.int64: "int64",
            }.get(obj.dtype) or str(obj.dtype).replace("torch.", "")
            self.shape = tuple(obj.shape)
            self.strides = tuple(obj.stride())
            kind = obj.device.type
            self.device = f"cuda:{obj.device.index}" if kind == "cuda" else kind
            self.writeable = True
        else:
            raise TypeError(
                f"{name}: expected a NumPy array or a torch tensor (got {type(obj).__name__})"
            )

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def empty(self):
        return 0 in self.shape

    def is_contiguous(self):
        if self.empty:  # no element has an address; frameworks report arbitrary strides
            return True
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True

    def export(self):
        """The object handed to _C: a DLPack producer (NumPy) or capsule (torch)."""
        if not self.is_torch:
            # DLPack cannot carry ml_dtypes' bfloat16; _C reads a uint16 view as bf16 bits.
            return self.obj.view(np.uint16) if self.dtype == "bf16" else self.obj
        # to_dlpack exports without stream synchronisation (Tensor.__dlpack__() without a stream
        # would make the default stream wait on the current one, which is not allowed while
        # capturing a CUDA graph); the kernels run on the current stream anyway.
        from torch.utils import dlpack

        return dlpack.to_dlpack(self.obj.detach())


def _expect_dtype(a, *allowed):
    if a.dtype not in allowed:
        want = " or ".join(allowed)
        raise TypeError(f"{a.name}: dtype must be {want} (got {a.dtype})")


def _expect_shape(a, shape, text):
    if a.shape != tuple(shape):
        raise ValueError(f"{a.name}: expected shape {text} = {list(shape)} (got {list(a.shape)})")


def _scalar(name, x):
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name}: expected a real number (got {type(x).__name__})")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number (got {type(x).__name__})") from None


def _host_values(a):
    """The values of a host array or CPU tensor (an _Array) as a NumPy array."""
    return a.obj.detach().numpy() if a.is_torch else a.obj


def _check_cu_seqlens_contents(values, total):
    values = np.asarray(values, dtype=np.int64)
    if values[0] != 0:
        raise ValueError(f"cu_seqlens: must start at 0 (got {values[0]})")
    steps = np.diff(values)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0)) + 1
        raise ValueError(
            f"cu_seqlens: must be non-decreasing (cu_seqlens[{i}]={values[i]} < "
            f"cu_seqlens[{i - 1}]={values[i - 1]})"
        )
    if values[-1] != total:
        raise ValueError(f"cu_seqlens: must end at B*T={total} (got {values[-1]})")


def fwd(
    q,
    k,
    v,
    g,
    beta,
    scale,
    out,
    A_log,
    dt_bias,
    lower_bound,
    initial_state=None,
    final_state=None,
    cu_seqlens=None,
    *,
    backend=None,
    cu_seqlens_cpu=None,
    state_indices=None,
    has_initial_state=None,
):
    """Kimi Delta Attention forward, FlashKDA's signature: writes ``out`` (and ``final_state``) in
    place and returns None.

    Arrays are NumPy arrays (bf16 as ``ml_dtypes.bfloat16``) or torch tensors, all on one device:

    ==============  ================  ======================================================
    q, k            bf16              [B, T, H, K]
    v, out          bf16              [B, T, HV, V]   (HV a multiple of H)
    g               bf16              [B, T, HV, K]
    beta            bf16              [B, T, HV]
    A_log           fp32              [HV], contiguous
    dt_bias         fp32              [HV, K] or [HV * K], contiguous
    initial_state   bf16/fp32/None    [N, HV, V, K], contiguous (None: zeros)
    final_state     bf16/fp32/None    [N, HV, V, K], contiguous; may be ``initial_state``
    cu_seqlens      int64/int32/None  [N + 1], requires B == 1 (None: N = B)
    ==============  ================  ======================================================

    q, k, v, g, beta and out may be strided views (e.g. slices of a packed qkv buffer) as long as
    their last dimension is contiguous.

    State pools (keyword-only, docs/serving.md): the prefill of a serving engine reads and writes
    the states of its requests in place, in a pool of P slots (P need not be N):

    =================  ================  ================================================
    state_indices      int32/None        [N], contiguous: sequence n uses slot
                                         ``state_indices[n]``; ``initial_state`` and
                                         ``final_state`` are then pools [P, HV, V, K] of
                                         the same P (usually the same tensor)
    has_initial_state  bool/uint8/None   [N], contiguous; needs ``initial_state``: a zero
                                         entry starts sequence n from zeros instead of its
                                         slot (a new request); its final state is still
                                         written
    =================  ================  ================================================

    A negative slot marks a padding sequence: no state of it is read or written, nor its rows of
    ``out``. Active sequences must use distinct slots. On the host the slots are checked (in
    [0, P), distinct) before anything is written (ValueError naming ``state_indices``); on CUDA
    they are not read on the host (no synchronisation, CUDA-graph capturable): a slot >= P is
    treated as padding and a slot shared by two sequences gives an undefined result.
    ``has_initial_state`` also works without ``state_indices`` (it then chooses between
    ``initial_state[n]`` and zeros).

    ``backend`` (keyword-only): None runs where the tensors live (CUDA tensors on the CUDA kernels,
    asynchronously on ``torch.cuda.current_stream()``; host arrays on the multi-threaded fp32 CPU
    path), ``"cpu"`` forces that CPU path, ``"reference"`` runs the float64 per-token recurrence on
    the host (slow; the test oracle), ``"cuda"`` insists on the CUDA kernels.

    Raises TypeError for a wrong dtype, ValueError for a wrong shape, stride, device or value
    (always before anything is written; the message starts with the argument's name),
    NotImplementedError (a RuntimeError) for a valid call this build or device cannot run (e.g. CUDA
    tensors with a build without the CUDA backend, or K != 128 on CUDA), RuntimeError for a CUDA
    runtime failure.

    CUDA ``cu_seqlens`` are copied to the host and their contents checked (start at 0,
    non-decreasing, end at B*T), which synchronises with the device, except while the current stream
    is capturing a CUDA graph: then the contents are the caller's responsibility.
    ``cu_seqlens_cpu`` (keyword-only, optional; fla's chunk_kda has the same argument): a host copy
    of ``cu_seqlens`` (same length, int64 or int32); when given, its contents are checked instead
    and no copy or synchronisation happens. It must hold the same values as ``cu_seqlens`` (not
    verified).
    """
    if type(q) is not np.ndarray:  # a torch tensor (or a mistake): fwd_torch, or the checked route
        return _TORCH_FWD(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state,
                          final_state, cu_seqlens, backend, cu_seqlens_cpu, state_indices,
                          has_initial_state)
    _fwd_checked(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                 cu_seqlens, backend, cu_seqlens_cpu, state_indices, has_initial_state)
    return None


def _validate(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
              cu_seqlens, backend, cu_seqlens_cpu, *, state_indices=None, has_initial_state=None,
              meta_ok=False):
    """Every check of fwd that needs no data (dtypes, shapes, strides, devices, scalars); raises
    TypeError/ValueError naming the argument. Works on FakeTensors too: the custom operators' fake
    implementations use it, with meta_ok (tensors on the meta device pass, for shape inference).
    Returns the checked arguments (the 13 positional ones of fwd, then state_indices and
    has_initial_state), the host cu_seqlens copy, whether they are on CUDA, and B*T."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of None, 'cuda', 'cpu', 'reference' (got {backend!r})")

    # ---- what was passed ----
    q, k, v, g, beta, out = (
        _Array(n, x) for n, x in zip(("q", "k", "v", "g", "beta", "out"), (q, k, v, g, beta, out))
    )
    A_log, dt_bias = _Array("A_log", A_log), _Array("dt_bias", dt_bias)
    init = None if initial_state is None else _Array("initial_state", initial_state)
    final = None if final_state is None else _Array("final_state", final_state)
    cu = None if cu_seqlens is None else _Array("cu_seqlens", cu_seqlens)
    cu_host = None if cu_seqlens_cpu is None else _Array("cu_seqlens_cpu", cu_seqlens_cpu)
    idx = None if state_indices is None else _Array("state_indices", state_indices)
    has = None if has_initial_state is None else _Array("has_initial_state", has_initial_state)
    scale = _scalar("scale", scale)
    lower_bound = _scalar("lower_bound", lower_bound)
    arrays = [a for a in (q, k, v, g, beta, out, A_log, dt_bias, init, final, cu, idx, has)
              if a is not None]

    # ---- dtypes ----
    for a in (q, k, v, g, beta, out):
        _expect_dtype(a, "bf16")
    _expect_dtype(A_log, "fp32")
    _expect_dtype(dt_bias, "fp32")
    for a in (init, final):
        if a is not None:
            _expect_dtype(a, "fp32", "bf16")
    if init is not None and final is not None and init.dtype != final.dtype:
        raise TypeError(
            f"final_state: dtype must match initial_state ({init.dtype}, got {final.dtype})"
        )
    if cu is not None:
        _expect_dtype(cu, "int64", "int32")
    if cu_host is not None:
        _expect_dtype(cu_host, "int64", "int32")
    if idx is not None:
        _expect_dtype(idx, "int32")
    if has is not None:
        _expect_dtype(has, "bool", "uint8")

    # ---- shapes ----
    if q.ndim != 4:
        raise ValueError(f"q: expected shape [B, T, H, K] (got {list(q.shape)})")
    B, T, H, K = q.shape
    _expect_shape(k, q.shape, "[B, T, H, K] like q")
    if v.ndim != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v: expected shape [B, T, HV, V] with B={B}, T={T} (got {list(v.shape)})")
    HV, V = v.shape[2:]
    if HV < 1 or HV % H:
        raise ValueError(f"v: number of value heads HV={HV} must be a positive multiple of H={H}")
    _expect_shape(g, (B, T, HV, K), "[B, T, HV, K]")
    _expect_shape(beta, (B, T, HV), "[B, T, HV]")
    _expect_shape(out, (B, T, HV, V), "[B, T, HV, V] like v")
    _expect_shape(A_log, (HV,), "[HV]")
    if dt_bias.shape not in ((HV, K), (HV * K,)):
        raise ValueError(
            f"dt_bias: expected shape [HV, K] = [{HV}, {K}] or [HV * K] = [{HV * K}] "
            f"(got {list(dt_bias.shape)})"
        )
    N = B
    if cu is not None:
        if cu.ndim != 1 or cu.shape[0] < 1:
            raise ValueError(f"cu_seqlens: expected shape [N + 1] (got {list(cu.shape)})")
        if B != 1:
            raise ValueError(f"cu_seqlens: requires batch size B == 1 (got B={B})")
        N = cu.shape[0] - 1
    if cu_host is not None:
        if cu is None:
            raise ValueError("cu_seqlens_cpu: given without cu_seqlens")
        _expect_shape(cu_host, cu.shape, "[N + 1] like cu_seqlens")
        if cu_host.device != "cpu":
            raise ValueError(f"cu_seqlens_cpu: must be in host memory (got device {cu_host.device})")
    if idx is not None:
        if init is None and final is None:
            raise ValueError("state_indices: needs initial_state or final_state (the pool)")
        _expect_shape(idx, (N,), "[N]")
    if has is not None:
        if init is None:
            raise ValueError("has_initial_state: needs initial_state")
        _expect_shape(has, (N,), "[N]")
    if idx is None:
        for a in (init, final):
            if a is not None:
                _expect_shape(a, (N, HV, V, K), "[N, HV, V, K]")
    else:  # pools [P, HV, V, K], P read from the first one given
        pool = init if init is not None else final
        if pool.ndim != 4 or pool.shape[1:] != (HV, V, K):
            raise ValueError(f"{pool.name}: expected shape [P, HV, V, K] = [P, {HV}, {V}, {K}] "
                             f"(got {list(pool.shape)})")
        if init is not None and final is not None:
            _expect_shape(final, init.shape, "[P, HV, V, K] with P of initial_state")

    # ---- strides ----
    for a in arrays:
        if not a.empty and any(s < 0 for s in a.strides):
            raise ValueError(f"{a.name}: negative strides are not supported (got {a.strides})")
    for a in (q, k, v, g, out):
        if not a.empty and a.shape[-1] > 1 and a.strides[-1] != 1:
            raise ValueError(
                f"{a.name}: the last dimension must be contiguous (stride 1, got {a.strides[-1]})"
            )
    for a in (A_log, dt_bias, init, final, cu, idx, has):
        if a is not None and not a.is_contiguous():
            raise ValueError(f"{a.name}: must be contiguous (got strides {a.strides})")
    for a in (out, final):
        if a is not None and not a.writeable:
            raise ValueError(f"{a.name}: array is read-only")

    # ---- values ----
    if not math.isfinite(scale):
        raise ValueError(f"scale: must be finite (got {scale})")
    if not -5.0 <= lower_bound < 0.0:
        raise ValueError(f"lower_bound: must satisfy -5 <= lower_bound < 0 (got {lower_bound})")

    # ---- device and backend ----
    device = q.device
    for a in arrays:
        if a.device != device:
            raise ValueError(f"{a.name}: on device {a.device}, but q is on {device}")
    on_cuda = device.startswith("cuda")
    if not on_cuda and device != "cpu" and not (meta_ok and device == "meta"):
        raise ValueError(f"q: unsupported device {device} (expected cpu or cuda)")
    if backend in ("cpu", "reference") and on_cuda:
        raise ValueError(f"backend: {backend!r} needs host arrays (got tensors on {device})")
    if backend == "cuda" and not on_cuda:
        raise ValueError("backend: 'cuda' needs CUDA tensors (got host arrays)")

    return (q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, init, final, cu, idx, has), \
        cu_host, on_cuda, B * T


def _fwd_checked(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                 cu_seqlens, backend, cu_seqlens_cpu, state_indices=None, has_initial_state=None):
    """fwd with every check in Python first: NumPy arrays, mixed arguments, and the torch calls the
    compiled layer rejected (so that their message is this module's)."""
    args, cu_host, on_cuda, total = _validate(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
        cu_seqlens, backend, cu_seqlens_cpu, state_indices=state_indices,
        has_initial_state=has_initial_state)
    if not on_cuda:
        # Host cu_seqlens and slot contents are checked by the C++ API before anything is written.
        _C.fwd(*_exports(*args), backend=backend or "cpu")
        return
    _fwd_cuda(args, cu_host, total)


def _exports(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, init, final, cu, idx=None,
             has=None):
    """The positional arguments of _C.fwd / _C.workspace_size (each call needs fresh exports)."""
    opt = lambda a: None if a is None else a.export()  # noqa: E731
    return (q.export(), k.export(), v.export(), g.export(), beta.export(), scale, out.export(),
            A_log.export(), dt_bias.export(), lower_bound, opt(init), opt(final), opt(cu), opt(idx),
            opt(has))


def _fwd_cuda(args, cu_host, total):
    """The checked route's CUDA call: `args` as returned by _validate."""
    torch = _torch()
    q, cu = args[0], args[12]
    device = q.obj.device
    # A build without the CUDA backend, or a GPU other than sm_90, is reported by the C++ API
    # (kUnsupported -> NotImplementedError) before anything is written. Slot indices stay on the
    # device: the kernel treats a slot outside [0, P) as padding.
    if cu_host is not None:
        _check_cu_seqlens_contents(_host_values(cu_host), total)
    elif cu is not None and not torch.cuda.is_current_stream_capturing():
        _check_cu_seqlens_contents(cu.obj.detach().cpu().numpy(), total)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        nbytes = _C.workspace_size(*_exports(*args), backend="cuda")
        workspace = None
        if nbytes:
            # From torch's caching allocator: stream-ordered, and usable under CUDA-graph capture.
            workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
            workspace = _Array("workspace", workspace).export()
        _C.fwd(*_exports(*args), backend="cuda", workspace=workspace, stream=stream)
