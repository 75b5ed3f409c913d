"""The KDA recurrence of docs/spec.md in float64 NumPy, written from the equations for the tests:
it shares no code with src/ (nor with flash_kda.reference), so a mistake in the compiled code's
head mapping (GVA), gate parameters, state slots or normalisation cannot hide in both."""

from __future__ import annotations

import numpy as np


def f64(x):
    """Any array (NumPy, ml_dtypes bf16, torch) as a float64 NumPy array."""
    if hasattr(x, "detach"):
        import torch

        x = x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def spans_of(B, T, cu_seqlens=None):
    """(row, begin, end) of each sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(c) for c in f64(cu_seqlens)]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def recurrence(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial=None, cu_seqlens=None,
               token_states=False, allow_neg_eigval=False):
    """(out [B, T, HV, V], final [N, HV, V, K]) of the recurrence; `initial` [N, HV, V, K] or None.
    Value head hv reads q/k head hv // (HV // H) (docs/spec.md, GVA). With token_states, a third
    value: the state after every token, [B, T, HV, V, K]. Gate forms (docs/spec.md, "Gate forms"):
    lower_bound None is the softplus gate, A_log None a rate of 1, allow_neg_eigval beta = 2 sigmoid."""
    q, k, v, g, beta = (f64(x) for x in (q, k, v, g, beta))
    dt_bias = f64(dt_bias)
    A_log = None if A_log is None else f64(A_log)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dt_bias = dt_bias.reshape(HV, K)
    spans = spans_of(B, T, cu_seqlens)
    out = np.zeros((B, T, HV, V))
    final = np.zeros((len(spans), HV, V, K))
    after = np.zeros((B, T, HV, V, K)) if token_states else None
    for n, (row, begin, end) in enumerate(spans):
        for hv in range(HV):
            h = hv // (HV // H)
            S = np.zeros((V, K)) if initial is None else f64(initial)[n, hv].copy()
            for t in range(begin, end):
                q_hat = q[row, t, h] / np.sqrt(np.dot(q[row, t, h], q[row, t, h]) + 1e-6)
                k_hat = k[row, t, h] / np.sqrt(np.dot(k[row, t, h], k[row, t, h]) + 1e-6)
                rate = 1.0 if A_log is None else np.exp(A_log[hv])
                x = g[row, t, hv] + dt_bias[hv]
                if lower_bound is None:
                    # softplus(x) = log(1 + e^x), written as max(x, 0) + log(1 + e^-|x|)
                    a = -rate * (np.maximum(x, 0.0) + np.log(1.0 + np.exp(-np.abs(x))))
                else:
                    a = lower_bound / (1.0 + np.exp(-rate * x))
                b = (2.0 if allow_neg_eigval else 1.0) / (1.0 + np.exp(-beta[row, t, hv]))
                S = S * np.exp(a)[None, :]
                S = S + b * np.outer(v[row, t, hv] - S @ k_hat, k_hat)
                out[row, t, hv] = scale * (S @ q_hat)
                if token_states:
                    after[row, t, hv] = S
            final[n, hv] = S
    return (out, final, after) if token_states else (out, final)


def rel(x, ref):
    x, ref = f64(x), f64(ref)
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / norm) if norm > 0 else float(np.linalg.norm(x))
