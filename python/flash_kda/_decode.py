"""decode: the decode step of a serving engine on a state pool (docs/serving.md). Eager calls are one
call into the compiled layer (flash_kda._C, which checks every argument in C++; flash_kda._eager
copies a device cu_seqlens to the host for it); under torch.compile, FakeTensor or other torch
dispatch modes a call on torch tensors is the custom operator torch.ops.flash_kda.decode
(flash_kda.torch_ops).
"""

from __future__ import annotations

from . import _C, _eager, _fwd
from ._arrays import MAX_DECODE_TOKENS  # noqa: F401  (flash_kda::kMaxDecodeTokens, re-exported)
from ._fwd import _ndarray, tracing


def decode(
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
    state,
    state_indices,
    *,
    num_accepted_tokens=None,
    cu_seqlens=None,
    backend=None,
    allow_neg_eigval=False,
):
    """One decode step (1 to 8 tokens per sequence) on a state pool: writes ``out`` and the pool
    slots in place and returns None.

    q, k, v, g, beta, out, A_log, dt_bias, scale, lower_bound, cu_seqlens and allow_neg_eigval are as
    for :func:`flash_kda.fwd` (``lower_bound=None``: the softplus gate; ``A_log=None`` with a
    lower_bound: rate 1; every backend), with T <= 8 tokens per sequence (every sequence of
    ``cu_seqlens`` at most 8). The recurrent state lives in a pool:

    ===================  =========  ==================================================
    state                bf16/fp32  [P, HV, V, K], contiguous; read and written in place
    state_indices        int32      [N] (one slot per sequence) or [N, S] (speculative)
    num_accepted_tokens  int32      [N], contiguous, only with [N, S] indices
    ===================  =========  ==================================================

    With [N] indices sequence n starts from slot ``state_indices[n]`` and writes its state back
    there. With [N, S] indices (S = 1 + drafts, T <= S) the state after token t is written to slot
    ``state_indices[n, t]`` and the step starts from ``state_indices[n, num_accepted_tokens[n] - 1]``
    (column 0 without ``num_accepted_tokens``). A negative read slot (or ``num_accepted_tokens[n]
    < 1``) makes sequence n padding: neither its state nor its rows of ``out`` are written; a
    negative write slot skips that one write. Active sequences must use distinct slots.

    ``backend`` as for fwd. Errors as for fwd (TypeError / ValueError naming the argument, raised
    before anything is written); on CUDA the head dimensions are K = V = 128 or K = V = 64 (others:
    NotImplementedError). The contents of ``state_indices`` / ``num_accepted_tokens`` (slot
    < P, distinct slots, 1 <= accepted <= S) are checked by the CPU backends before anything is
    written; on CUDA they are not checked on the host (no synchronisation, CUDA-graph capturable):
    the kernel treats an out-of-range read slot as padding and skips an out-of-range write slot, and
    a slot shared by two active sequences gives an undefined result (docs/serving.md). CUDA
    ``cu_seqlens`` are checked as in fwd (copied to the host unless a CUDA graph is being captured).

    torch tensors run on the device they live on (CUDA: asynchronously on
    ``torch.cuda.current_stream()``); under torch.compile (no graph break), FakeTensor or another
    torch dispatch mode the call is the custom operator ``torch.ops.flash_kda.decode``, which
    mutates ``out`` and ``state`` (docs/torch.md).
    """
    # tracing(q), inline once flash_kda._fwd knows torch's predicates
    if type(q) is not _ndarray and (tracing(q) if _fwd._is_compiling is None
                                    else _fwd._is_compiling() or _fwd._dispatch_depth()):
        from . import torch_ops  # registers the operators; a plain import, which torch.compile traces

        torch_ops.decode_op(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state,
                            state_indices, num_accepted_tokens, cu_seqlens, backend, allow_neg_eigval)
        return None
    # the host copy of a device cu_seqlens (for its checks), then the one _C call
    cu_seqlens_cpu = None if cu_seqlens is None else _eager.host_copy(q, cu_seqlens)
    _C.decode(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
              num_accepted_tokens, cu_seqlens, cu_seqlens_cpu, backend, allow_neg_eigval)
    return None
