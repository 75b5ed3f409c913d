"""decode: the decode step of a serving engine on a state pool (docs/serving.md).

Argument checks as for fwd (same vocabulary, same messages for the shared arguments), then one call
into flash_kda._C.decode. NumPy arrays and torch tensors both take this checked route in eager mode;
under torch.compile, FakeTensor or other torch dispatch modes a call on torch tensors becomes the
custom operator torch.ops.flash_kda.decode (flash_kda.torch_ops), whose fake implementation runs the
same data-free checks.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _C
from ._fwd import _Array, _check_cu_seqlens_contents, _expect_dtype, _torch, _validate

MAX_DECODE_TOKENS = 8  # flash_kda::kMaxDecodeTokens


def _first_torch_call(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
                      num_accepted_tokens, cu_seqlens, backend):
    """The route of a call whose q is not a NumPy array until flash_kda.torch_ops is loaded: loads
    it (registering the custom operators; it then replaces _TORCH_DECODE by its decode_torch) when
    torch is imported, else takes the checked route (no argument can be a torch tensor)."""
    args = (q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
            num_accepted_tokens, cu_seqlens, backend)
    if sys.modules.get("torch") is None:
        return _decode_checked(*args)
    from . import torch_ops  # a plain import statement, which torch.compile can trace

    return torch_ops.decode_torch(*args)


# The route of torch tensors (and anything else that is not a NumPy array): _first_torch_call, then
# flash_kda.torch_ops.decode_torch. Always a function (torch.compile guards on it).
_TORCH_DECODE = _first_torch_call


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
):
    """One decode step (1 to 8 tokens per sequence) on a state pool: writes ``out`` and the pool
    slots in place and returns None.

    q, k, v, g, beta, out, A_log, dt_bias, scale, lower_bound and cu_seqlens are as for
    :func:`flash_kda.fwd`, with T <= 8 tokens per sequence (every sequence of ``cu_seqlens`` at most
    8). The recurrent state lives in a pool:

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
    before anything is written). The contents of ``state_indices`` / ``num_accepted_tokens`` (slot
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
    if type(q) is not np.ndarray:  # a torch tensor (or a mistake): decode_torch, or the checked route
        return _TORCH_DECODE(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state,
                             state_indices, num_accepted_tokens, cu_seqlens, backend)
    _decode_checked(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
                    num_accepted_tokens, cu_seqlens, backend)
    return None


def _validate_decode(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
                     num_accepted_tokens, cu_seqlens, backend, *, meta_ok=False):
    """Every check of decode that needs no data (dtypes, shapes, strides, devices, scalars); raises
    TypeError/ValueError naming the argument. Works on FakeTensors (the fake implementation of
    torch.ops.flash_kda.decode; meta_ok as for _fwd._validate). Returns the checked fwd arguments
    (as _fwd._validate), the pool, the indices and num_accepted_tokens (_Array or None), whether
    they are on CUDA, and B*T."""
    args, _, on_cuda, total = _validate(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, None, None, cu_seqlens, backend,
        None, meta_ok=meta_ok)
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, _, _, cu, _, _ = args
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    N = B if cu is None else cu.shape[0] - 1
    if cu is None and T > MAX_DECODE_TOKENS:
        raise ValueError(f"q: decode takes at most {MAX_DECODE_TOKENS} tokens per sequence (got T={T}); "
                         "use fwd for longer sequences")

    st = _Array("state", state)
    idx = _Array("state_indices", state_indices)
    acc = None if num_accepted_tokens is None else _Array("num_accepted_tokens", num_accepted_tokens)

    # ---- dtypes ----
    _expect_dtype(st, "fp32", "bf16")
    _expect_dtype(idx, "int32")
    if acc is not None:
        _expect_dtype(acc, "int32")

    # ---- shapes ----
    if st.ndim != 4 or st.shape[1:] != (HV, V, K):
        raise ValueError(f"state: expected shape [P, HV, V, K] = [P, {HV}, {V}, {K}] (got {list(st.shape)})")
    if idx.ndim not in (1, 2) or idx.shape[0] != N:
        raise ValueError(f"state_indices: expected shape [N] or [N, S] with N={N} (got {list(idx.shape)})")
    S = idx.shape[1] if idx.ndim == 2 else 1
    if not 1 <= S <= MAX_DECODE_TOKENS:
        raise ValueError(
            f"state_indices: S (slots per sequence) must be in [1, {MAX_DECODE_TOKENS}] (got {S})")
    if S > 1 and cu is None and T > S:
        raise ValueError(f"state_indices: speculative decoding writes one slot per token: S ({S}) must be "
                         f">= T ({T})")
    if acc is not None:
        if idx.ndim != 2 or S < 2:
            raise ValueError("num_accepted_tokens: needs speculative state_indices [N, S] with S > 1")
        if acc.shape != (N,):
            raise ValueError(f"num_accepted_tokens: expected shape [N] = [{N}] (got {list(acc.shape)})")

    # ---- strides, writability, devices ----
    for a in (st, idx, acc):
        if a is not None and not a.empty and any(s < 0 for s in a.strides):
            raise ValueError(f"{a.name}: negative strides are not supported (got {a.strides})")
    if not st.is_contiguous():
        raise ValueError(f"state: must be contiguous (got strides {st.strides})")
    if acc is not None and not acc.is_contiguous():
        raise ValueError(f"num_accepted_tokens: must be contiguous (got strides {acc.strides})")
    if not idx.empty:
        if S > 1 and idx.strides[1] != 1:
            raise ValueError(
                f"state_indices: the last dimension must be contiguous (got strides {idx.strides})")
        if N > 1 and idx.strides[0] < S:
            raise ValueError(f"state_indices: row stride ({idx.strides[0]}) must be >= S ({S})")
    if not st.writeable:
        raise ValueError("state: array is read-only")
    for a in (st, idx, acc):
        if a is not None and a.device != q.device:
            raise ValueError(f"{a.name}: on device {a.device}, but q is on {q.device}")
    return args, st, idx, acc, on_cuda, total


def _decode_checked(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
                    num_accepted_tokens, cu_seqlens, backend):
    """decode with every check in Python first (NumPy arrays and torch tensors in eager mode; the
    implementation of the operator torch.ops.flash_kda.decode)."""
    args, st, idx, acc, on_cuda, total = _validate_decode(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
        num_accepted_tokens, cu_seqlens, backend)
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, _, _, cu, _, _ = args
    strict = any(a.is_torch for a in (q, st, idx))
    opt = lambda a: None if a is None else a.export()  # noqa: E731
    exports = lambda: (q.export(), k.export(), v.export(), g.export(), beta.export(), scale,  # noqa: E731
                       out.export(), A_log.export(), dt_bias.export(), lower_bound, st.export(),
                       idx.export(), opt(acc), opt(cu))
    if not on_cuda:
        # The C++ API checks host slot and cu_seqlens contents before anything is written.
        _C.decode(*exports(), backend=backend or "cpu", strict_dtypes=strict)
        return None

    torch = _torch()
    device = q.obj.device
    if cu is not None and not torch.cuda.is_current_stream_capturing():
        values = cu.obj.detach().cpu().numpy()
        _check_cu_seqlens_contents(values, total)
        lengths = values[1:] - values[:-1]
        if len(lengths) and lengths.max() > MAX_DECODE_TOKENS:
            n = int(lengths.argmax())
            raise ValueError(f"cu_seqlens: sequence {n} has {int(lengths[n])} tokens; decode takes at most "
                             f"{MAX_DECODE_TOKENS} (use fwd)")
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        _C.decode(*exports(), backend="cuda", stream=stream, strict_dtypes=strict)
    return None
