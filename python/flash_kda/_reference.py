"""The KDA recurrence of docs/spec.md in float64 NumPy, independent of the compiled code.

It returns unrounded float64 results, which is what errors are measured against (the compiled
``backend="reference"`` writes its output as bf16 like every backend, so comparing against it adds
a second bf16 rounding). Vectorised over heads, one Python step per token: for checks on a few
thousand tokens, not for speed.
"""

from __future__ import annotations

import sys

import numpy as np


def _f64(name, x):
    if x is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected an array (got {type(x).__name__})") from None


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _l2_normalise(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _softplus(x):
    return np.logaddexp(0.0, x)  # log(1 + e^x) without overflow


def reference(
    q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state=None, cu_seqlens=None, *,
    allow_neg_eigval=False
):
    """Float64 KDA forward. Takes the inputs of :func:`flash_kda.fwd` (NumPy arrays or torch
    tensors, any dtype; no ``out``/``final_state``) and returns ``(out, final_state)`` as new float64
    arrays of shapes [B, T, HV, V] and [N, HV, V, K]. The gate forms of fwd: ``lower_bound=None`` is
    the softplus gate, ``A_log=None`` (with a lower_bound) a rate of 1, ``allow_neg_eigval=True``
    beta = 2 sigmoid(beta)."""
    q, k, v, g, beta = (_f64(n, x) for n, x in zip("q k v g beta".split(), (q, k, v, g, beta)))
    A_log, dt_bias = _f64("A_log", A_log), _f64("dt_bias", dt_bias)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H  # GVA: value head hv reads q/k head hv // group

    q_hat = np.repeat(_l2_normalise(q), group, axis=2)
    k_hat = np.repeat(_l2_normalise(k), group, axis=2)
    rate = np.ones((HV, 1)) if A_log is None else np.exp(A_log)[:, None]
    x = g + dt_bias.reshape(HV, K)
    with np.errstate(over="ignore"):  # the softplus gate may decay a channel to exactly 0
        if lower_bound is None:
            alpha = np.exp(-rate * _softplus(x))  # [B, T, HV, K]
        else:
            alpha = np.exp(lower_bound * _sigmoid(rate * x))
    beta = (2.0 if allow_neg_eigval else 1.0) * _sigmoid(beta)

    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(c) for c in _f64("cu_seqlens", cu_seqlens)]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]

    out = np.zeros((B, T, HV, V))
    final = np.zeros((len(spans), HV, V, K))
    init = _f64("initial_state", initial_state)
    for n, (row, begin, end) in enumerate(spans):
        S = np.zeros((HV, V, K)) if init is None else init[n].copy()  # S[h] is V x K
        for t in range(begin, end):
            S *= alpha[row, t][:, None, :]
            kt = k_hat[row, t]
            Sk = np.einsum("hvk,hk->hv", S, kt)
            S += (beta[row, t][:, None] * (v[row, t] - Sk))[:, :, None] * kt[:, None, :]
            out[row, t] = scale * np.einsum("hvk,hk->hv", S, q_hat[row, t])
        final[n] = S
    return out, final
