"""flash-kda for PyTorch: the custom operators and ``chunk_kda``.

Importing this module imports torch and registers five operators (docs/torch.md):

``torch.ops.flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
initial_state, final_state, cu_seqlens=None, cu_seqlens_cpu=None, backend=None,
state_indices=None, has_initial_state=None, allow_neg_eigval=False) -> ()``
    ``flash_kda.fwd`` as an operator: mutates ``out`` and ``final_state`` (a state pool with
    ``state_indices``). ``A_log`` and ``lower_bound`` may be None (docs/spec.md, "Gate forms").

``torch.ops.flash_kda.fwd_checkpointed(..., has_initial_state, checkpoint_state, checkpoint_indices,
checkpoint_start, checkpoint_interval, allow_neg_eigval=False) -> ()``
    the same with prefix-cache checkpoints; also mutates ``checkpoint_state``. Every argument up to
    ``checkpoint_interval`` is required (None where optional): torch before 2.12 drops trailing
    arguments equal to their defaults when it redispatches and then indexes the mutated ones, so a
    mutated argument must never have a default — hence a second operator instead of defaulted
    arguments on the first. Arguments added later come after every mutated one, with defaults
    (dropping them leaves the mutated ones where they were).

``torch.ops.flash_kda.decode(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state,
state_indices, num_accepted_tokens=None, cu_seqlens=None, backend=None, allow_neg_eigval=False) -> ()``
    ``flash_kda.decode`` as an operator: mutates ``out`` and the pool ``state``.

``torch.ops.flash_kda.chunk_kda(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound,
initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state, allow_neg_eigval=False) -> (out, final_state)``
    allocates and returns ``out`` [B, T, HV, V] (bf16) and ``final_state`` [N, HV, V, K] (the
    dtype of ``initial_state``, fp32 without one); ``final_state`` has shape [0] when
    ``output_final_state`` is False. Mutates nothing.

``torch.ops.flash_kda.chunk_kda_checkpointed(..., output_final_state, checkpoint_state,
checkpoint_indices, checkpoint_start, checkpoint_interval, allow_neg_eigval=False) -> (out, final_state)``
    the same with checkpoints; mutates ``checkpoint_state`` (all arguments required, as above).

Their implementations are the eager calls (one call into the compiled layer, flash_kda._C, which
checks every argument in C++ and provides the CUDA workspace). Their fake (meta)
implementations run the same C++ checks on the tensors' metadata (flash_kda._C.check_fwd /
check_decode), so functions calling them trace under ``torch.compile(fullgraph=True)`` and
``torch.export``. ``flash_kda.fwd`` / ``flash_kda.decode`` / ``chunk_kda`` call the operators
while torch.compile traces or a torch dispatch mode is active, and the eager calls otherwise.
``flash_kda`` loads this module at import when torch is already imported, else on the first
traced call or the first use of ``flash_kda.chunk_kda``.
"""

from typing import Optional, Tuple

import torch

from . import _C, _eager
from ._arrays import describe

__all__ = ["chunk_kda", "fwd_op", "decode_op"]

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_dispatch_depth = getattr(torch._C, "_len_torch_dispatch_stack", None) or (lambda: 0)
_grad_enabled = torch.is_grad_enabled
_STATE_DTYPES = (torch.float32, torch.bfloat16)


def _real_or_none(name, x):
    """lower_bound for an operator: None (the softplus gate) stays None, anything else as _real."""
    return None if x is None else _real(name, x)


def _real(name, x):
    """A Python float for an operator's float argument (the eager calls pass scalars on to the
    compiled layer, which converts them)."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name}: expected a real number (got {type(x).__name__})")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number (got {type(x).__name__})") from None
    except OverflowError:
        raise ValueError(f"{name}: must be finite (got a number too large for a float)") from None


# ---- operators -----------------------------------------------------------------------------------


def _eager_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
               cu_seqlens_cpu, *rest):
    """Both forward operators' implementation, as flash_kda.fwd's eager route: the host copy of a
    device cu_seqlens (for its checks), then the one _C call (`rest`: _C.fwd's arguments after
    cu_seqlens_cpu)."""
    if cu_seqlens is not None and cu_seqlens_cpu is None:
        cu_seqlens_cpu = _eager.host_copy(q, cu_seqlens)
    _C.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
           cu_seqlens_cpu, *rest)


@torch.library.custom_op("flash_kda::fwd", mutates_args=("out", "final_state"))
def _fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: torch.Tensor,
    lower_bound: Optional[float],
    # No defaults up to final_state, a mutated argument: torch before 2.12 drops trailing arguments
    # equal to their defaults when it redispatches, then indexes the mutated ones (IndexError).
    initial_state: Optional[torch.Tensor],
    final_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    state_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    allow_neg_eigval: bool = False,
) -> None:
    _eager_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
               cu_seqlens_cpu, state_indices, has_initial_state, None, None, None, None, backend, allow_neg_eigval)


def _check_fwd_meta(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                    final_state=None, cu_seqlens=None, cu_seqlens_cpu=None, backend=None, state_indices=None,
                    has_initial_state=None, checkpoint_state=None, checkpoint_indices=None,
                    checkpoint_start=None, checkpoint_interval=None, allow_neg_eigval=False):
    d = describe
    _C.check_fwd(d(q), d(k), d(v), d(g), d(beta), scale, d(out), d(A_log), d(dt_bias), lower_bound,
                 d(initial_state), d(final_state), d(cu_seqlens), d(cu_seqlens_cpu), d(state_indices),
                 d(has_initial_state), d(checkpoint_state), d(checkpoint_indices), d(checkpoint_start),
                 checkpoint_interval=checkpoint_interval, backend="auto" if backend is None else backend,
                 allow_neg_eigval=bool(allow_neg_eigval))


@_fwd_op.register_fake
def _fwd_fake(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
              final_state=None, cu_seqlens=None, cu_seqlens_cpu=None, backend=None, state_indices=None,
              has_initial_state=None, allow_neg_eigval=False):
    _check_fwd_meta(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                    cu_seqlens, cu_seqlens_cpu, backend, state_indices, has_initial_state,
                    allow_neg_eigval=allow_neg_eigval)


# Every argument required (see the module docstring): checkpoint_state is mutated.
@torch.library.custom_op("flash_kda::fwd_checkpointed", mutates_args=("out", "final_state", "checkpoint_state"))
def _fwd_ckpt_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: torch.Tensor,
    lower_bound: Optional[float],
    initial_state: Optional[torch.Tensor],
    final_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    cu_seqlens_cpu: Optional[torch.Tensor],
    backend: Optional[str],
    state_indices: Optional[torch.Tensor],
    has_initial_state: Optional[torch.Tensor],
    checkpoint_state: Optional[torch.Tensor],
    checkpoint_indices: Optional[torch.Tensor],
    checkpoint_start: Optional[torch.Tensor],
    checkpoint_interval: Optional[int],
    allow_neg_eigval: bool = False,
) -> None:
    _eager_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
               cu_seqlens_cpu, state_indices, has_initial_state, checkpoint_state, checkpoint_indices,
               checkpoint_start, checkpoint_interval, backend, allow_neg_eigval)


_fwd_ckpt_op.register_fake(_check_fwd_meta)


@torch.library.custom_op("flash_kda::decode", mutates_args=("out", "state"))
def _decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: torch.Tensor,
    lower_bound: Optional[float],
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted_tokens: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    allow_neg_eigval: bool = False,
) -> None:
    # as flash_kda.decode: the host copy of a device cu_seqlens (for its checks), then the one _C call
    cu_seqlens_cpu = None if cu_seqlens is None else _eager.host_copy(q, cu_seqlens)
    _C.decode(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
              num_accepted_tokens, cu_seqlens, cu_seqlens_cpu, backend, allow_neg_eigval)


@_decode_op.register_fake
def _decode_fake(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
                 num_accepted_tokens=None, cu_seqlens=None, backend=None, allow_neg_eigval=False):
    d = describe
    _C.check_decode(d(q), d(k), d(v), d(g), d(beta), scale, d(out), d(A_log), d(dt_bias), lower_bound,
                    d(state), d(state_indices), d(num_accepted_tokens), d(cu_seqlens), None,
                    backend="auto" if backend is None else backend, allow_neg_eigval=bool(allow_neg_eigval))


def fwd_op(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
           cu_seqlens, cu_seqlens_cpu, backend, state_indices, has_initial_state, checkpoint_interval=None,
           checkpoint_state=None, checkpoint_indices=None, checkpoint_start=None, allow_neg_eigval=False):
    """flash_kda.fwd while traced: the operator (its float arguments made Python floats)."""
    args = (q, k, v, g, beta, _real("scale", scale), out, A_log, dt_bias,
            _real_or_none("lower_bound", lower_bound), initial_state, final_state, cu_seqlens, cu_seqlens_cpu,
            backend, state_indices, has_initial_state)
    if _no_checkpoints(checkpoint_interval, checkpoint_state, checkpoint_indices, checkpoint_start):
        _fwd_op(*args, bool(allow_neg_eigval))
    else:
        _fwd_ckpt_op(*args, checkpoint_state, checkpoint_indices, checkpoint_start, _interval(checkpoint_interval),
                     bool(allow_neg_eigval))


def _no_checkpoints(*checkpoint_args):
    return all(x is None for x in checkpoint_args)


def _interval(x):
    """checkpoint_interval as the operator's int (None stays None; the C++ layer checks the value)."""
    if x is None or isinstance(x, int):
        return x
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"checkpoint_interval: expected an integer or None (got {type(x).__name__})")
    return x.__index__()


def decode_op(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
              num_accepted_tokens, cu_seqlens, backend, allow_neg_eigval=False):
    """flash_kda.decode while traced: the operator."""
    _decode_op(q, k, v, g, beta, _real("scale", scale), out, A_log, dt_bias,
               _real_or_none("lower_bound", lower_bound), state, state_indices, num_accepted_tokens, cu_seqlens,
               backend, bool(allow_neg_eigval))


def _allocate(q, v, initial_state, cu_seqlens, output_final_state):
    """out and final_state (or None) for the chunk_kda operator; raises the errors fwd would for the
    ranks it needs to read the sizes."""
    if q.dim() != 4 or v.dim() != 4 or (cu_seqlens is not None and cu_seqlens.dim() != 1):
        for name, x, rank, text in (("q", q, 4, "[B, T, H, K]"), ("v", v, 4, "[B, T, HV, V]"),
                                    ("cu_seqlens", cu_seqlens, 1, "[N + 1]")):
            if x is not None and x.dim() != rank:
                raise ValueError(f"{name}: expected shape {text} (got {list(x.shape)})")
    out = torch.empty_like(v, memory_format=torch.contiguous_format)
    return out, _final_state(q, v, initial_state, cu_seqlens) if output_final_state else None


def _final_state(q, v, initial_state, cu_seqlens):
    """An empty final state [N, HV, V, K]: the dtype of initial_state, fp32 without one (or with one
    of a dtype fwd rejects)."""
    q_shape, v_shape = q.shape, v.shape  # each .shape is a new torch.Size: read once
    N = q_shape[0] if cu_seqlens is None else max(cu_seqlens.shape[0] - 1, 0)
    dtype = torch.float32
    if initial_state is not None:
        state_dtype = initial_state.dtype
        if state_dtype in _STATE_DTYPES:
            dtype = state_dtype
    return torch.empty((N, v_shape[2], v_shape[3], q_shape[3]), dtype=dtype, device=q.device)


def _chunk_impl(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                cu_seqlens_cpu, output_final_state, checkpoint_state=None, checkpoint_indices=None,
                checkpoint_start=None, checkpoint_interval=None, allow_neg_eigval=False):
    out, final = _allocate(q, v, initial_state, cu_seqlens, output_final_state)
    # as flash_kda.fwd: the host copy of a device cu_seqlens (for its checks), then the one _C call
    if cu_seqlens is not None and cu_seqlens_cpu is None:
        cu_seqlens_cpu = _eager.host_copy(q, cu_seqlens)
    _C.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final, cu_seqlens,
           cu_seqlens_cpu, None, None, checkpoint_state, checkpoint_indices, checkpoint_start, checkpoint_interval,
           None, allow_neg_eigval)
    return out, _placeholder(q) if final is None else final


@torch.library.custom_op("flash_kda::chunk_kda", mutates_args=())
def _chunk_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    A_log: Optional[torch.Tensor],
    dt_bias: torch.Tensor,
    lower_bound: Optional[float],
    initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    cu_seqlens_cpu: Optional[torch.Tensor],
    output_final_state: bool,
    allow_neg_eigval: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    return _chunk_impl(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                       cu_seqlens_cpu, output_final_state, allow_neg_eigval=allow_neg_eigval)


# Every argument required (see the module docstring): checkpoint_state is mutated.
@torch.library.custom_op("flash_kda::chunk_kda_checkpointed", mutates_args=("checkpoint_state",))
def _chunk_ckpt_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    A_log: Optional[torch.Tensor],
    dt_bias: torch.Tensor,
    lower_bound: Optional[float],
    initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    cu_seqlens_cpu: Optional[torch.Tensor],
    output_final_state: bool,
    checkpoint_state: Optional[torch.Tensor],
    checkpoint_indices: Optional[torch.Tensor],
    checkpoint_start: Optional[torch.Tensor],
    checkpoint_interval: Optional[int],
    allow_neg_eigval: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    return _chunk_impl(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                       cu_seqlens_cpu, output_final_state, checkpoint_state, checkpoint_indices, checkpoint_start,
                       checkpoint_interval, allow_neg_eigval)


def _chunk_fake(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                cu_seqlens_cpu, output_final_state, checkpoint_state=None, checkpoint_indices=None,
                checkpoint_start=None, checkpoint_interval=None, allow_neg_eigval=False):
    out, final = _allocate(q, v, initial_state, cu_seqlens, output_final_state)
    _check_fwd_meta(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final,
                    cu_seqlens, cu_seqlens_cpu, checkpoint_state=checkpoint_state,
                    checkpoint_indices=checkpoint_indices, checkpoint_start=checkpoint_start,
                    checkpoint_interval=checkpoint_interval, allow_neg_eigval=allow_neg_eigval)
    return out, _placeholder(q) if final is None else final


def _chunk_plain_fake(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                      cu_seqlens_cpu, output_final_state, allow_neg_eigval=False):
    return _chunk_fake(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                       cu_seqlens_cpu, output_final_state, allow_neg_eigval=allow_neg_eigval)


_chunk_op.register_fake(_chunk_plain_fake)
_chunk_ckpt_op.register_fake(_chunk_fake)


def _placeholder(q):
    """The final_state output of the chunk_kda operator when none was asked for."""
    return torch.empty((0,), dtype=torch.float32, device=q.device)


# ---- chunk_kda -------------------------------------------------------------------------------------

def _unsupported(name, value, why):
    return NotImplementedError(f"{name}: {value!r} is not supported by flash_kda.chunk_kda ({why})")


def chunk_kda(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=True,
    use_gate_in_kernel=True,
    use_beta_sigmoid_in_kernel=True,
    allow_neg_eigval=False,
    safe_gate=False,
    lower_bound=None,
    disable_recompute=False,
    return_intermediate_states=False,
    state_v_first=True,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    cp_context=None,
    use_graph=False,
    max_num_seqs=None,
    *,
    A_log=None,
    dt_bias=None,
    chunk_size=64,
    transpose_state_layout=None,
    checkpoint_interval=None,
    checkpoint_state=None,
    checkpoint_indices=None,
    checkpoint_start=None,
):
    """KDA forward with flash-linear-attention's ``chunk_kda`` interface (fla 0.6.0 argument names
    and positions); allocates and returns ``(o, final_state)``.

    ``o`` is bf16 [B, T, HV, V]; ``final_state`` is None unless ``output_final_state``, then
    [N, HV, V, K] with ``state_v_first=True`` (the default here) or [N, HV, K, V] with
    ``state_v_first=False``, of the dtype of ``initial_state`` (fp32 without one). Computes what
    fla computes with ``use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
    use_beta_sigmoid_in_kernel=True``: raw q, k (L2-normalised inside), raw gate ``g`` with
    ``A_log`` [HV] and ``dt_bias`` [HV * K] or [HV, K], beta logits. The gate follows fla: with a
    ``lower_bound`` (-5 <= lower_bound < 0) ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
    (``A_log=None``: a rate of 1); with ``lower_bound=None`` the unbounded softplus gate
    ``-exp(A_log) * softplus(g + dt_bias)`` of Kimi-Linear-48B (A_log required). ``safe_gate``
    (fla's faster kernel for the bounded gate; False by default, as in fla) changes nothing here but
    needs a ``lower_bound`` when True, as in fla. ``dt_bias=None``: no bias.
    ``allow_neg_eigval=True``: beta = 2 * sigmoid(beta). Every form runs on CPU and CUDA tensors.

    Options flash-kda does not implement raise ``NotImplementedError`` naming the argument:
    ``use_qk_l2norm_in_kernel=False``, ``use_gate_in_kernel=False``,
    ``use_beta_sigmoid_in_kernel=False``, ``return_intermediate_states=True``, ``cp_context``,
    and inputs that require grad while grad mode is on (forward only: call it under
    ``torch.inference_mode()`` or ``torch.no_grad()``). ``disable_recompute`` (a backward option)
    and ``use_graph`` (the kernel is CUDA-graph safe anyway) are accepted and have no effect;
    ``chunk_size`` is checked (32 or 64) and ignored. ``state_v_first=False`` transposes the states
    in and out (one copy each way).

    Prefix-cache checkpoints (keyword-only, flash-kda's own): ``checkpoint_interval``,
    ``checkpoint_state``, ``checkpoint_indices``, ``checkpoint_start`` as in :func:`flash_kda.fwd`;
    ``checkpoint_state`` is written in place, V-first [P2, HV, V, K] whatever ``state_v_first``
    says (every backend).

    Everything else is checked as by :func:`flash_kda.fwd` (TypeError / ValueError naming the
    argument). CUDA tensors run on the current stream; ``cu_seqlens`` on CUDA are checked through a
    host copy unless ``cu_seqlens_cpu`` is given or a CUDA graph is being captured. Under
    ``torch.compile`` the call is the operator ``torch.ops.flash_kda.chunk_kda``.
    """
    if (not (use_qk_l2norm_in_kernel and use_gate_in_kernel and use_beta_sigmoid_in_kernel)
            or (safe_gate and lower_bound is None) or return_intermediate_states
            or cp_context is not None or chunk_size != 64 or transpose_state_layout is not None
            or (use_graph and max_num_seqs is not None)):
        state_v_first = _check_options(
            use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, safe_gate,
            lower_bound, return_intermediate_states, state_v_first, cu_seqlens, cp_context,
            use_graph, max_num_seqs, chunk_size, transpose_state_layout)
    if type(q) is not _Tensor or type(v) is not _Tensor or q.dim() != 4 or v.dim() != 4:
        _check_tensors(q, k, v, g, beta)  # raises unless q..beta are tensor subclasses of the right rank
    if _grad_enabled():
        _check_no_grad(q, k, v, g, beta, A_log, dt_bias, initial_state)
    if scale is None:
        scale = q.shape[3] ** -0.5
    if A_log is None and lower_bound is not None:
        # fla: the gate is lower_bound * sigmoid(g + dt_bias), i.e. exp(A_log) = 1. Zeros give that
        # rate exactly on every backend (the CUDA one does not take a missing A_log yet). Without a
        # lower_bound, None goes on: the softplus gate needs A_log, and the C++ layer says so.
        A_log = torch.zeros(v.shape[2], dtype=torch.float32, device=q.device)
    if dt_bias is None:
        dt_bias = torch.zeros((v.shape[2], q.shape[3]), dtype=torch.float32, device=q.device)
    if not state_v_first and isinstance(initial_state, _Tensor) and initial_state.dim() == 4:
        initial_state = initial_state.transpose(2, 3).contiguous()

    if _is_compiling() or _dispatch_depth():
        args = (q, k, v, g, beta, _real("scale", scale), A_log, dt_bias,
                _real_or_none("lower_bound", lower_bound), initial_state, cu_seqlens, cu_seqlens_cpu,
                bool(output_final_state))
        if _no_checkpoints(checkpoint_interval, checkpoint_state, checkpoint_indices, checkpoint_start):
            o, final = _chunk_op(*args, bool(allow_neg_eigval))
        else:
            o, final = _chunk_ckpt_op(*args, checkpoint_state, checkpoint_indices, checkpoint_start,
                                      _interval(checkpoint_interval), bool(allow_neg_eigval))
        if not output_final_state:
            final = None
    else:
        o = torch.empty_like(v, memory_format=torch.contiguous_format)
        final = None
        if output_final_state:
            final = _final_state(q, v, initial_state, cu_seqlens)
        # as flash_kda.fwd: the host copy of a device cu_seqlens (for its checks), then the one _C call
        if cu_seqlens is not None and cu_seqlens_cpu is None:
            cu_seqlens_cpu = _eager.host_copy(q, cu_seqlens)
        _C.fwd(q, k, v, g, beta, scale, o, A_log, dt_bias, lower_bound, initial_state, final, cu_seqlens,
               cu_seqlens_cpu, None, None, checkpoint_state, checkpoint_indices, checkpoint_start,
               checkpoint_interval, None, allow_neg_eigval)
    if final is not None and not state_v_first:
        final = final.transpose(2, 3).contiguous()
    return o, final


def _check_options(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                   safe_gate, lower_bound, return_intermediate_states, state_v_first,
                   cu_seqlens, cp_context, use_graph, max_num_seqs, chunk_size, transpose_state_layout):
    """chunk_kda's options beyond the default ones: raises for what flash-kda does not implement;
    returns state_v_first (fla's deprecated transpose_state_layout is an alias)."""
    if transpose_state_layout is not None:
        if state_v_first is not True and bool(state_v_first) != bool(transpose_state_layout):
            raise ValueError("transpose_state_layout: deprecated name of state_v_first; pass one")
        state_v_first = bool(transpose_state_layout)
    if not use_qk_l2norm_in_kernel:
        raise _unsupported("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel,
                           "q and k are always L2-normalised inside; pass them raw with True")
    if not use_gate_in_kernel:
        raise _unsupported("use_gate_in_kernel", use_gate_in_kernel,
                           "the gate is always computed inside from the raw g, A_log, dt_bias and "
                           "lower_bound")
    if not use_beta_sigmoid_in_kernel:
        raise _unsupported("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel,
                           "beta is always taken as logits; pass it raw with True")
    if safe_gate and lower_bound is None:
        raise ValueError("safe_gate: True needs a lower_bound (fla's safe gate is the bounded one, "
                         "-5 <= lower_bound < 0); pass safe_gate=False for the softplus gate of lower_bound=None")
    if return_intermediate_states:
        raise _unsupported("return_intermediate_states", return_intermediate_states,
                           "intermediate states are not produced")
    if cp_context is not None:
        raise _unsupported("cp_context", type(cp_context).__name__, "no context parallelism")
    if chunk_size not in (32, 64):
        raise ValueError(f"chunk_size: must be 32 or 64 (got {chunk_size!r})")
    if (use_graph and max_num_seqs is not None and isinstance(cu_seqlens, _Tensor)
            and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] - 1 != max_num_seqs):
        raise ValueError(f"max_num_seqs: cu_seqlens holds {cu_seqlens.shape[0] - 1} sequences, "
                         f"expected max_num_seqs={max_num_seqs}")
    return state_v_first


def _check_tensors(q, k, v, g, beta):
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(x, _Tensor):
            raise TypeError(f"{name}: expected a torch tensor (got {type(x).__name__})")
    if q.dim() != 4:
        raise ValueError(f"q: expected shape [B, T, H, K] (got {list(q.shape)})")
    if v.dim() != 4:
        raise ValueError(f"v: expected shape [B, T, HV, V] (got {list(v.shape)})")


def _check_no_grad(*tensors):
    if any(isinstance(x, _Tensor) and x.requires_grad for x in tensors):
        raise NotImplementedError(
            "chunk_kda: an input requires grad, but flash-kda computes the forward only (no "
            "backward); call it under torch.inference_mode() or torch.no_grad(), or use fla's "
            "chunk_kda for training")

