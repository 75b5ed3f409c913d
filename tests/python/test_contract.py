"""The contract of docs/spec.md against hostile and exact inputs, on every host backend and route:

- aliasing: a written buffer sharing bytes with any other argument is rejected naming both, before
  anything is written (out/cu_seqlens, pool/state_indices, decode state_indices inside out, out = q,
  final_state overlapping out);
- index arrays are read once: another thread rewriting cu_seqlens / state_indices while the call
  runs (the GIL is released) cannot make it read or write out of bounds;
- bad sizes and scalars (H = 0, HV = 0 straight into _C, scale = 10**400), misaligned cu_seqlens,
  NaN propagation, torch's negative bit;
- a hand-computed case (one-hot q and k, three tokens: out and state in closed form), with unit and
  with small-norm q, k (sum x^2 = 1e-6, which pins the eps inside the square root);
- GVA (H = 2, HV = 4, distinct per-head A_log / dt_bias) through fwd, pools, decode and the torch
  operators against tests/python/oracle.py, which shares no code with src/;
- initial_state and final_state of different dtypes on every host path.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import flash_kda
from flash_kda import _C
from conftest import BF16, OUT_LIMIT, make_problem, poisoned
from oracle import f64, recurrence, rel

try:
    import torch
except ImportError:
    torch = None
else:
    import flash_kda.torch_ops  # noqa: F401  (registers the operators)
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

BACKENDS = ["cpu", "reference"]
STATE_LIMIT = 3e-3  # docs/spec.md, fp32 state
BF16_STATE_LIMIT = 4e-3


def _fwd(x, backend=None, **kw):
    a = {**x, **kw}
    flash_kda.fwd(a["q"], a["k"], a["v"], a["g"], a["beta"], a["scale"], a["out"], a["A_log"], a["dt_bias"],
                  a["lower_bound"], a["initial_state"], a["final_state"], a["cu_seqlens"], backend=backend,
                  state_indices=a.get("state_indices"), has_initial_state=a.get("has_initial_state"))


def _bytes(a):
    return np.ascontiguousarray(a).view(np.uint8).copy()


def _view(buffer, offset, shape, dtype):
    """An array of `shape` and `dtype` at byte `offset` of the uint8 `buffer`."""
    count = int(np.prod(shape))
    return np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)


# ---- aliasing ----------------------------------------------------------------------------------------

def _rejected(call, written, match):
    before = [_bytes(a) for a in written]
    with pytest.raises(ValueError, match=match):
        call()
    for a, b in zip(written, before):
        assert np.array_equal(_bytes(a), b), "a rejected call wrote"


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_sharing_bytes_with_cu_seqlens_is_rejected(rng, backend):
    x = make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[30, 10])
    buffer = np.zeros(x["out"].nbytes, np.uint8)
    out = _view(buffer, 0, x["out"].shape, BF16)
    out[...] = 1.0
    cu = _view(buffer, 64, (3,), np.int64)  # cu_seqlens inside out's bytes
    cu[...] = [0, 30, 40]
    _rejected(lambda: _fwd(x, backend, out=out, cu_seqlens=cu), [buffer, x["final_state"]],
              r"^out: overlaps cu_seqlens")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_holding_state_indices_is_rejected(rng, backend):
    x = make_problem(rng, B=3, T=20, H=2)
    P = 4
    per_slot = 2 * 128 * 128 * 4
    buffer = np.zeros(P * per_slot, np.uint8)
    pool = _view(buffer, 0, (P, 2, 128, 128), np.float32)
    idx = _view(buffer, per_slot * 3, (3,), np.int32)  # the indices live in slot 3 of the pool
    idx[...] = [0, 1, 2]
    _rejected(lambda: _fwd(x, backend, initial_state=pool, final_state=pool, state_indices=idx),
              [buffer, x["out"]], r"^final_state: overlaps state_indices")


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_with_state_indices_inside_out_is_rejected(rng, backend):
    x = make_problem(rng, B=3, T=1, H=2)
    buffer = np.zeros(x["out"].nbytes, np.uint8)
    out = _view(buffer, 0, x["out"].shape, BF16)
    idx = _view(buffer, 128, (3,), np.int32)
    idx[...] = [0, 1, 2]
    pool = np.zeros((3, 2, 128, 128), np.float32)
    _rejected(lambda: flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, x["A_log"],
                                       x["dt_bias"], x["lower_bound"], pool, idx, backend=backend),
              [buffer, pool], r"^out: overlaps state_indices")


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_that_is_q_and_final_state_overlapping_out_are_rejected(rng, backend):
    x = make_problem(rng, B=1, T=24, H=2, state="fp32")
    q = x["q"].copy()
    _rejected(lambda: _fwd(x, backend, q=q, out=q), [q, x["final_state"]], r"^out: overlaps q")
    buffer = np.zeros(x["out"].nbytes + x["final_state"].nbytes, np.uint8)
    out = _view(buffer, 0, x["out"].shape, BF16)
    final = _view(buffer, x["out"].nbytes - 256, x["final_state"].shape, np.float32)
    _rejected(lambda: _fwd(x, backend, out=out, final_state=final), [buffer], r"overlaps")


def test_initial_state_overlapping_final_state_names_both(rng):
    x = make_problem(rng, B=2, T=8, H=1, state="fp32")
    buffer = np.zeros((3, 1, 128, 128), np.float32)
    _rejected(lambda: _fwd(x, initial_state=buffer[:2], final_state=buffer[1:]), [buffer, x["out"]],
              r"^final_state: overlaps initial_state")


# ---- index arrays read once ------------------------------------------------------------------------------

def _hammer(array, values, stop):
    """Rewrites array[1] with each of `values` in turn until `stop` is set."""
    i = 0
    while not stop.is_set():
        array[1] = values[i % len(values)]
        i += 1


@pytest.mark.parametrize("what", ["cu_seqlens", "state_indices"])
def test_index_arrays_changed_by_another_thread_during_the_call(rng, what):
    """Each call reads its index arrays once: whatever the other thread writes meanwhile, a call
    either runs on a valid copy or rejects an invalid one; it never reads or writes out of bounds."""
    x = make_problem(rng, B=1, T=64, H=2, state="fp32", cu_seqlens=[20, 24, 20])
    pool = rng.standard_normal((4, 2, 128, 128), dtype=np.float32)
    idx = np.array([0, 1, 2], np.int32)
    hostile = {"cu_seqlens": (x["cu_seqlens"], [20, 10 ** 12, -10 ** 12, 44]),
               "state_indices": (idx, [1, 2 ** 31 - 1, -2 ** 31, 3])}[what]
    stop = threading.Event()
    thread = threading.Thread(target=_hammer, args=(*hostile, stop))
    thread.start()
    ok = rejected = 0
    try:
        for _ in range(60):
            try:
                _fwd(x, "cpu", initial_state=pool, final_state=pool, state_indices=idx)
                ok += 1
            except ValueError as e:
                assert str(e).startswith(("cu_seqlens:", "state_indices:")), str(e)
                rejected += 1
    finally:
        stop.set()
        thread.join()
    assert ok + rejected == 60


# ---- sizes, scalars, alignment, NaN ---------------------------------------------------------------------

def test_no_heads_is_an_error_naming_q(rng):
    x = make_problem(rng, B=1, T=4, H=1)
    zero = {n: np.zeros((1, 4, 0, 128), BF16) for n in ("q", "k")}
    with pytest.raises(ValueError, match=r"^q: number of heads"):
        _fwd(x, **zero)


def test_compiled_layer_rejects_zero_value_heads(rng):
    """HV = 0 (empty v, g, beta, out) straight into _C: an error, not HV = H."""
    x = make_problem(rng, B=1, T=4, H=2)
    empty = lambda *s: np.zeros(s, np.uint16)  # noqa: E731  (bf16 bits)
    with pytest.raises(ValueError, match=r"^v: number of value heads"):
        _C.fwd(x["q"].view(np.uint16), x["k"].view(np.uint16), empty(1, 4, 0, 128), empty(1, 4, 0, 128),
               empty(1, 4, 0), x["scale"], empty(1, 4, 0, 128), np.zeros(0, np.float32),
               np.zeros((0, 128), np.float32), -5.0, bf16_bits=0b111111)


@pytest.mark.parametrize("value,error", [(10 ** 400, ValueError), ("0.1", TypeError), (None, TypeError)])
def test_scale_that_is_no_float_names_scale(rng, value, error):
    x = make_problem(rng, B=1, T=4, H=1)
    with pytest.raises(error, match=r"^scale: "):
        _fwd(x, scale=value)
    assert np.isnan(x["out"].astype(np.float32)).all()


@pytest.mark.parametrize("dtype,offset", [(np.int64, 4), (np.int32, 2)])
def test_misaligned_cu_seqlens_are_rejected(rng, dtype, offset):
    x = make_problem(rng, B=1, T=30, H=1, cu_seqlens=[10, 20])
    buffer = np.zeros(64, np.uint8)
    cu = _view(buffer, offset, (3,), dtype)
    cu[...] = [0, 10, 30]
    with pytest.raises(ValueError, match=r"^cu_seqlens: pointer must be \d-byte aligned"):
        _fwd(x, cu_seqlens=cu)


def test_nan_in_g_propagates_on_every_backend(rng):
    """The fast CPU exp used to clamp NaN to exp(88) and return finite numbers. Every element the
    float64 reference makes NaN is NaN on the CPU path too (the chunked form may also spread it to
    the earlier tokens of the NaN's chunk)."""
    x = make_problem(rng, B=1, T=40, H=2, state="fp32")
    x["g"][0, 17, 1, 5] = np.nan
    results = {}
    for backend in BACKENDS:
        y = dict(x, out=poisoned(x["out"].shape, BF16), final_state=poisoned(x["final_state"].shape, np.float32))
        _fwd(y, backend)
        results[backend] = np.isnan(y["out"].astype(np.float32)), np.isnan(y["final_state"])
    assert results["reference"][0][0, 17:, 1].all() and not results["reference"][0][0, :17].any()
    for cpu_nan, ref_nan in zip(results["cpu"], results["reference"]):
        assert cpu_nan[ref_nan].all()


@needs_torch
def test_negative_bit_tensors_are_resolved_or_rejected(rng):
    x = make_problem(rng, B=1, T=30, H=2, state="fp32")
    t = {n: (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(a))
         if isinstance(a, np.ndarray) else a for n, a in x.items()}
    negated = (-t["q"]).contiguous()
    for route in ("fwd", "op"):
        results = []
        for q in (negated, torch._neg_view(t["q"])):
            out = torch.full_like(t["out"], float("nan"))
            args = (q, t["k"], t["v"], t["g"], t["beta"], x["scale"], out, t["A_log"], t["dt_bias"], -5.0,
                    t["initial_state"], None)
            (flash_kda.fwd if route == "fwd" else torch.ops.flash_kda.fwd)(*args)
            results.append(out)
        assert torch.equal(results[0].view(torch.int16), results[1].view(torch.int16)), route
    with pytest.raises(ValueError, match=r"^out: "):
        flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], torch._neg_view(t["out"]),
                      t["A_log"], t["dt_bias"], -5.0)


# ---- the hand-computed case -----------------------------------------------------------------------------

K = V = 128


def _one_hot_problem(c, lower_bound=-2.0):
    """Three tokens of one head: keys c e0, c e1, c e0; queries c e0, c e0, c e1; A_log = dt_bias =
    g = 0 and beta logits 0, so every channel decays by alpha = exp(lower_bound / 2) a token and
    beta = 1/2; the initial state is w in column 5 (a channel no key or query touches)."""
    T = 3
    q = np.zeros((1, T, 1, K), np.float32)
    k = np.zeros((1, T, 1, K), np.float32)
    for t, (kc, qc) in enumerate([(0, 0), (1, 0), (0, 1)]):
        k[0, t, 0, kc] = c
        q[0, t, 0, qc] = c
    v = (np.arange(T * V, dtype=np.float32).reshape(1, T, 1, V) % 7 - 3).astype(BF16)
    S0 = np.zeros((1, 1, V, K), np.float32)
    S0[0, 0, :, 5] = (np.arange(V) % 5 - 2) / 4
    x = dict(q=q.astype(BF16), k=k.astype(BF16), v=v, g=np.zeros((1, T, 1, K), BF16),
             beta=np.zeros((1, T, 1), BF16), scale=0.5, A_log=np.zeros(1, np.float32),
             dt_bias=np.zeros((1, K), np.float32), lower_bound=lower_bound, cu_seqlens=None,
             initial_state=S0, final_state=poisoned((1, 1, V, K), np.float32),
             out=poisoned((1, T, 1, V), BF16))
    return x


def _closed_form(x):
    """out [3, V] and the final state [V, K] of _one_hot_problem, from the algebra."""
    c = float(x["k"][0, 0, 0, 0])  # c as stored (bf16)
    kappa = c / np.sqrt(c * c + 1e-6)  # |k_hat| = |q_hat| (the eps inside the root)
    alpha, beta, scale = np.exp(x["lower_bound"] / 2), 0.5, x["scale"]
    v1, v2, v3 = (f64(x["v"][0, t, 0]) for t in range(3))
    w = x["initial_state"][0, 0, :, 5].astype(np.float64)
    out = np.stack([scale * beta * kappa ** 2 * v1,
                    scale * alpha * beta * kappa ** 2 * v1,
                    scale * alpha * beta * kappa ** 2 * v2])
    S = np.zeros((V, K))
    S[:, 0] = alpha ** 2 * beta * kappa * v1 + beta * kappa * (v3 - alpha ** 2 * beta * kappa ** 2 * v1)
    S[:, 1] = alpha * beta * kappa * v2
    S[:, 5] = alpha ** 3 * w
    return out, S


def _bf16_close(got, want):
    """Each element within one bf16 rounding (2^-8 relative) of the exact value."""
    got = f64(got)
    assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want) + 1e-30), np.abs(got - want).max()


@pytest.mark.parametrize("c", [1.0, float(ml_dtypes.bfloat16(1e-3))], ids=["unit-norm", "small-norm"])
@pytest.mark.parametrize("route", ["cpu", "reference", "decode-cpu", "decode-reference", "op", "chunk_kda"])
def test_hand_computed_case(c, route):
    if route in ("op", "chunk_kda") and torch is None:
        pytest.skip("needs torch")
    x = _one_hot_problem(c)
    want_out, want_state = _closed_form(x)
    if route in ("cpu", "reference"):
        _fwd(x, route)
        out, state = x["out"], x["final_state"]
    elif route.startswith("decode"):
        state = x["initial_state"].copy()
        flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"], x["dt_bias"],
                         x["lower_bound"], state, np.array([0], np.int32), backend=route.split("-")[1])
        out = x["out"]
    else:
        t = {n: (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16
                 else torch.from_numpy(a)) if isinstance(a, np.ndarray) else a for n, a in x.items()}
        if route == "op":
            torch.ops.flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], 0.5, t["out"], t["A_log"],
                                    t["dt_bias"], x["lower_bound"], t["initial_state"], t["final_state"])
            out, state = t["out"], t["final_state"]
        else:
            with torch.inference_mode():
                out, state = flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=0.5,
                                                 initial_state=t["initial_state"], output_final_state=True,
                                                 lower_bound=x["lower_bound"], A_log=t["A_log"],
                                                 dt_bias=t["dt_bias"])
    _bf16_close(f64(out)[0, :, 0], want_out)
    got_state = f64(state)[0, 0]
    assert np.all(np.abs(got_state - want_state) <= 1e-5 * np.abs(want_state).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_norm_q_and_k_pin_the_eps(rng, backend):
    """sum q^2 = sum k^2 = 1e-6: with the eps inside the root |q_hat| = 1/sqrt(2), outside it ~1."""
    x = make_problem(rng, B=1, T=50, H=2, state="fp32")
    for n in ("q", "k"):
        a = x[n].astype(np.float32)
        a *= 1e-3 / np.linalg.norm(a, axis=-1, keepdims=True)
        x[n] = a.astype(BF16)
    _fwd(x, backend)
    out64, state64 = recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"],
                                x["dt_bias"], x["lower_bound"], x["initial_state"])
    assert rel(x["out"], out64) <= OUT_LIMIT and rel(x["final_state"], state64) <= STATE_LIMIT


# ---- GVA against the independent oracle ---------------------------------------------------------------

def _gva(rng, state="fp32"):
    x = make_problem(rng, B=1, T=90, H=2, HV=4, state=state, cu_seqlens=[40, 0, 33, 17])
    x["A_log"] = np.array([-1.0, 0.0, 0.7, 1.5], np.float32)  # distinct per value head
    x["dt_bias"] = (x["dt_bias"] + np.arange(4, dtype=np.float32)[:, None]).astype(np.float32)
    return x


def _oracle(x, initial=None):
    return recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"], x["dt_bias"],
                      x["lower_bound"], x["initial_state"] if initial is None else initial, x["cu_seqlens"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_gva_fwd_against_the_oracle(rng, backend):
    x = _gva(rng)
    _fwd(x, backend)
    out64, state64 = _oracle(x)
    assert rel(x["out"], out64) <= OUT_LIMIT and rel(x["final_state"], state64) <= STATE_LIMIT


@pytest.mark.parametrize("backend", BACKENDS)
def test_gva_pool_and_decode_against_the_oracle(rng, backend):
    """A pool prefill, then decode steps of 1..3 tokens; the oracle runs the whole sequences."""
    N, P, steps = 3, 7, (2, 1, 3)
    T0 = 20
    full = make_problem(rng, B=N, T=T0 + sum(steps), H=2, HV=4, state="fp32")
    full["A_log"] = np.array([-1.0, 0.0, 0.7, 1.5], np.float32)
    slots = np.array([5, 0, 3], np.int32)
    pool = poisoned((P, 4, 128, 128), np.float32)
    pool[slots] = full["initial_state"]
    out = poisoned(full["out"].shape, BF16)
    cut = lambda n, a, b: np.ascontiguousarray(full[n][:, a:b])  # noqa: E731
    pre = dict(full, **{n: cut(n, 0, T0) for n in ("q", "k", "v", "g", "beta")}, out=poisoned((N, T0, 4, 128), BF16))
    _fwd(pre, backend, initial_state=pool, final_state=pool, state_indices=slots)
    out[:, :T0] = pre["out"]
    t = T0
    for T in steps:
        step = {n: cut(n, t, t + T) for n in ("q", "k", "v", "g", "beta")}
        o = poisoned((N, T, 4, 128), BF16)
        flash_kda.decode(step["q"], step["k"], step["v"], step["g"], step["beta"], full["scale"], o, full["A_log"],
                         full["dt_bias"], full["lower_bound"], pool, slots, backend=backend)
        out[:, t:t + T] = o
        t += T
    out64, state64 = _oracle(full)
    assert rel(out, out64) <= OUT_LIMIT
    assert rel(pool[slots], state64) <= STATE_LIMIT
    assert np.isnan(pool[[1, 2, 4, 6]]).all()  # unused slots untouched


@needs_torch
@pytest.mark.parametrize("op", ["fwd", "decode", "chunk_kda"])
def test_gva_operators_against_the_oracle(rng, op):
    x = _gva(rng)
    t = {n: (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(a))
         if isinstance(a, np.ndarray) else a for n, a in x.items()}
    if op == "fwd":
        torch.ops.flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t["out"], t["A_log"],
                                t["dt_bias"], x["lower_bound"], t["initial_state"], t["final_state"], t["cu_seqlens"])
        out64, state64 = _oracle(x)
        assert rel(t["out"], out64) <= OUT_LIMIT and rel(t["final_state"], state64) <= STATE_LIMIT
    elif op == "chunk_kda":
        o, final = torch.ops.flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t["A_log"],
                                                 t["dt_bias"], x["lower_bound"], t["initial_state"], t["cu_seqlens"],
                                                 None, True)
        out64, state64 = _oracle(x)
        assert rel(o, out64) <= OUT_LIMIT and rel(final, state64) <= STATE_LIMIT
    else:  # one token per sequence of the same problem, on a pool
        N = 4
        y = make_problem(rng, B=N, T=1, H=2, HV=4, state="fp32")
        y["A_log"], y["dt_bias"] = x["A_log"], x["dt_bias"]
        u = {n: (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16
                 else torch.from_numpy(a)) if isinstance(a, np.ndarray) else a for n, a in y.items()}
        slots = torch.tensor([3, 1, 0, 2], dtype=torch.int32)
        pool = u["initial_state"][[2, 1, 3, 0]].clone()  # slot s holds sequence n's state where slots[n] == s
        torch.ops.flash_kda.decode(u["q"], u["k"], u["v"], u["g"], u["beta"], y["scale"], u["out"], u["A_log"],
                                   u["dt_bias"], y["lower_bound"], pool, slots)
        out64, state64 = recurrence(y["q"], y["k"], y["v"], y["g"], y["beta"], y["scale"], y["A_log"], y["dt_bias"],
                                    y["lower_bound"], y["initial_state"])
        assert rel(u["out"], out64) <= OUT_LIMIT and rel(pool[slots.long()], state64) <= STATE_LIMIT


# ---- initial_state and final_state of different dtypes ------------------------------------------------------

@pytest.mark.parametrize("dtypes", [("bf16", "fp32"), ("fp32", "bf16")], ids=["bf16-to-fp32", "fp32-to-bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dtypes_may_differ(rng, backend, dtypes):
    x = make_problem(rng, B=1, T=60, H=2, state=dtypes[0], cu_seqlens=[20, 0, 40])
    final_dtype = np.float32 if dtypes[1] == "fp32" else BF16
    x["final_state"] = poisoned(x["final_state"].shape, final_dtype)
    _fwd(x, backend)
    out64, state64 = _oracle(x)
    assert rel(x["out"], out64) <= OUT_LIMIT
    assert rel(x["final_state"], state64) <= (STATE_LIMIT if dtypes[1] == "fp32" else BF16_STATE_LIMIT)
    # the empty sequence converts its initial state exactly
    np.testing.assert_array_equal(f64(x["final_state"][1]), f64(x["initial_state"][1]).astype(final_dtype)
                                  .astype(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dtypes_may_differ_on_pools(rng, backend):
    x = make_problem(rng, B=3, T=12, H=2)
    slots = np.array([4, -1, 1], np.int32)
    init = poisoned((6, 2, 128, 128), BF16)
    init[[4, 1]] = rng.standard_normal((2, 2, 128, 128), dtype=np.float32).astype(BF16)
    final = poisoned((6, 2, 128, 128), np.float32)
    _fwd(x, backend, initial_state=init, final_state=final, state_indices=slots)
    gathered = np.zeros((3, 2, 128, 128))
    gathered[[0, 2]] = f64(init[[4, 1]])
    out64, state64 = _oracle(x, gathered)
    assert rel(x["out"][[0, 2]], out64[[0, 2]]) <= OUT_LIMIT
    assert rel(final[[4, 1]], state64[[0, 2]]) <= STATE_LIMIT
    assert np.isnan(final[[0, 2, 3, 5]]).all()


def test_the_same_tensor_keeps_one_dtype(rng):
    x = make_problem(rng, B=1, T=8, H=1, state="fp32")
    buffer = np.zeros(x["initial_state"].nbytes, np.uint8)
    as_fp32 = _view(buffer, 0, x["initial_state"].shape, np.float32)
    as_bf16 = _view(buffer, 0, x["initial_state"].shape, BF16)  # the same address, another dtype
    with pytest.raises((TypeError, ValueError), match=r"^final_state: "):
        _fwd(x, initial_state=as_fp32, final_state=as_bf16)


@needs_torch
def test_state_dtypes_may_differ_through_the_operator(rng):
    x = make_problem(rng, B=1, T=40, H=2, state="bf16", cu_seqlens=[25, 15])
    t = {n: (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(a))
         if isinstance(a, np.ndarray) else a for n, a in x.items()}
    final = torch.full((2, 2, 128, 128), float("nan"), dtype=torch.float32)
    torch.ops.flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t["out"], t["A_log"],
                            t["dt_bias"], x["lower_bound"], t["initial_state"], final, t["cu_seqlens"])
    out64, state64 = _oracle(x)
    assert rel(t["out"], out64) <= OUT_LIMIT and rel(final, state64) <= STATE_LIMIT
