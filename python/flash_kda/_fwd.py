"""fwd: the public forward. Eager calls are one call into the compiled layer (flash_kda._C, whose C++
contract layer checks every argument; flash_kda._eager copies a device cu_seqlens to the host for
it); under torch.compile, FakeTensor or another torch dispatch mode a call on torch tensors is the
custom operator torch.ops.flash_kda.fwd (flash_kda.torch_ops), whose fake implementation runs the
same C++ checks without data.
"""

from __future__ import annotations

import numpy as np

from . import _C, _eager
from ._arrays import torch_module

_ndarray = np.ndarray
# torch's two predicates (torch.compiler.is_compiling, the length of the torch dispatch-mode stack),
# looked up by tracing once torch is imported; from then on fwd and flash_kda.decode call them
# themselves (one Python call less on the eager route).
_is_compiling = _dispatch_depth = None


def tracing(q):
    """True when a call on `q` must be a torch operator: torch is imported, q is not a NumPy array,
    and torch.compile is tracing or a torch dispatch mode (FakeTensorMode, ...) is active."""
    global _is_compiling, _dispatch_depth
    if type(q) is _ndarray:
        return False
    if _is_compiling is None:
        torch = torch_module()
        if torch is None:
            return False
        _is_compiling, _dispatch_depth = torch.compiler.is_compiling, torch._C._len_torch_dispatch_stack
    return _is_compiling() or _dispatch_depth() > 0


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
    checkpoint_interval=None,
    checkpoint_state=None,
    checkpoint_indices=None,
    checkpoint_start=None,
    allow_neg_eigval=False,
):
    """Kimi Delta Attention forward, FlashKDA's signature: writes ``out`` (and ``final_state``) in
    place and returns None.

    Arrays are NumPy arrays (bf16 as ``ml_dtypes.bfloat16``) or torch tensors, all on one device:

    ==============  ================  ======================================================
    q, k            bf16              [B, T, H, K]
    v, out          bf16              [B, T, HV, V]   (HV a multiple of H)
    g               bf16              [B, T, HV, K]
    beta            bf16              [B, T, HV]
    A_log           fp32/None         [HV], contiguous (None: a rate of 1; needs a lower_bound)
    dt_bias         fp32              [HV, K] or [HV * K], contiguous
    initial_state   bf16/fp32/None    [N, HV, V, K], contiguous (None: zeros)
    final_state     bf16/fp32/None    [N, HV, V, K], contiguous; may be ``initial_state``
    cu_seqlens      int64/int32/None  [N + 1], requires B == 1 (None: N = B)
    ==============  ================  ======================================================

    Gate forms (docs/spec.md, "Gate forms"; fla's names): a ``lower_bound`` (-5 <= lower_bound < 0)
    selects the bounded gate ``a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``A_log=None``:
    ``lower_bound * sigmoid(g + dt_bias)``); ``lower_bound=None`` the unbounded gate of
    Kimi-Linear-48B, ``a = -exp(A_log) * softplus(g + dt_bias)`` (A_log required). With
    ``allow_neg_eigval=True`` (keyword-only) beta is ``2 * sigmoid(beta)``. The CPU backends compute
    every form, and so does the CUDA backend.

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

    ``initial_state`` and ``final_state`` may have different dtypes (fla passes a bf16 initial
    state with an fp32 final state) unless they are the same tensor; the CUDA backend does not
    support that yet (NotImplementedError). No buffer the call writes may share memory with another
    argument, except ``final_state`` being ``initial_state`` (docs/spec.md, Aliasing).

    Prefix-cache checkpoints (keyword-only, docs/serving.md "Prefix-cache checkpoints"; the
    definition is docs/spec.md's Extensions): with ``checkpoint_interval`` I (a positive multiple
    of 16; None or 0: none), sequence n whose first token sits at the absolute position
    ``checkpoint_start[n]`` (int32/int64 [N]; None: all 0) writes its state after every absolute
    position B - 1 with B a multiple of I it reaches (B <= start + length) into slot
    ``checkpoint_indices[n, m]`` (int32 [N, M], last dimension contiguous; m counts the multiples
    reached) of ``checkpoint_state`` (bf16/fp32 [P2, HV, V, K], contiguous, in its dtype). A slot of
    -1 skips that one, boundaries past column M are not written, other slots are not touched.
    ``checkpoint_state`` may be the state pool itself; its written checkpoint slots must then be
    slots no sequence of the call uses as its state. Every backend (CUDA: the prepared plans, with
    each sequence's chunk grid shifted so that boundaries end chunks; docs/kernel.md).

    Raises TypeError for a wrong dtype, ValueError for a wrong shape, stride, device or value
    (always before anything is written; the message starts with the argument's name),
    NotImplementedError (a RuntimeError) for a valid call this build or device cannot run (e.g. CUDA
    tensors with a build without the CUDA backend, or on CUDA a head dimension other than
    K = V = 128 or K = V = 64), RuntimeError for a CUDA runtime failure.

    Every check is the C++ library's (src/api): this function only converts the arrays. CUDA
    tensors run on the current stream of their own device. CUDA ``cu_seqlens`` are copied to the
    host and their contents checked (start at 0, non-decreasing, end at B*T), which synchronises
    with the device, except while the current stream is capturing a CUDA graph: then the contents
    are the caller's responsibility. ``cu_seqlens_cpu`` (keyword-only, optional; fla's chunk_kda has
    the same argument): a host copy of ``cu_seqlens`` (same length and dtype); when given, its
    contents are checked instead and no copy or synchronisation happens. On CUDA it must hold the
    same values as ``cu_seqlens`` (not verifiable without a synchronisation); on the host it is
    compared with ``cu_seqlens``.
    """
    # tracing(q), inline once torch's predicates are known
    if type(q) is not _ndarray and (tracing(q) if _is_compiling is None else _is_compiling() or _dispatch_depth()):
        from . import torch_ops  # registers the operators; a plain import, which torch.compile traces

        torch_ops.fwd_op(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state,
                         final_state, cu_seqlens, cu_seqlens_cpu, backend, state_indices, has_initial_state,
                         checkpoint_interval, checkpoint_state, checkpoint_indices, checkpoint_start,
                         allow_neg_eigval)
        return None
    # the host copy of a device cu_seqlens (for its checks), then the one _C call
    if cu_seqlens is not None and cu_seqlens_cpu is None:
        cu_seqlens_cpu = _eager.host_copy(q, cu_seqlens)
    _C.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
           cu_seqlens_cpu, state_indices, has_initial_state, checkpoint_state, checkpoint_indices, checkpoint_start,
           checkpoint_interval, backend, allow_neg_eigval)
    return None
