"""The gate forms of docs/spec.md ("Gate forms") through the Python package: lower_bound=None (the
softplus gate of Kimi-Linear-48B), A_log=None (the sigmoid gate at rate 1), allow_neg_eigval=True,
on both CPU backends, forward and decode, pools and checkpoints, GVA with distinct per-head A_log /
dt_bias, extreme gates; flash_kda.reference, the torch operators (eager, fake tensors, compile) and
chunk_kda; on CUDA (tests marked `cuda`: torch with CUDA and an sm_90 GPU) the decode in every form,
the forward in every form, the softplus gate also under extreme gates. Every result is measured against tests/python/oracle.py (no code shared with src/)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import flash_kda
from conftest import BF16, OUT_LIMIT, FP32_STATE_LIMIT, assert_written, make_problem, poisoned, rel
from oracle import recurrence

BACKENDS = ["cpu", "reference"]
# name: (lower_bound, drop A_log, allow_neg_eigval)
FORMS = {
    "sigmoid-no-A_log": (-5.0, True, False),
    "softplus": (None, False, False),
    "neg-eigval": (-5.0, False, True),
    "softplus-neg-eigval": (None, False, True),
}
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def _with_form(x, form):
    lower_bound, no_A_log, neg = FORMS[form]
    x = dict(x, lower_bound=lower_bound)
    if no_A_log:
        x["A_log"] = None
    return x, neg


def _oracle(x, neg, token_states=False):
    return recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"], x["dt_bias"],
                      x["lower_bound"], x["initial_state"], x["cu_seqlens"], token_states=token_states,
                      allow_neg_eigval=neg)


def _fwd(x, neg, backend, **kw):
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                  x["dt_bias"], x["lower_bound"], x["initial_state"], x["final_state"], x["cu_seqlens"],
                  backend=backend, allow_neg_eigval=neg, **kw)


def _set_g(x, t, hv, value, channels=slice(None)):
    x["g"][:, t, hv, channels] = value


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("layout", ["fixed", "varlen-gva"])
def test_forward_matches_oracle(rng, backend, form, layout):
    if layout == "fixed":
        x = make_problem(rng, B=2, T=37, H=2, state="fp32")
    else:
        x = make_problem(rng, B=1, T=90, H=2, HV=4, state="fp32", cu_seqlens=[50, 0, 39, 1], K=64, V=32)
    x, neg = _with_form(x, form)
    _fwd(x, neg, backend)
    out64, final64 = _oracle(x, neg)
    assert_written("out", x["out"])
    assert_written("final_state", x["final_state"])
    assert rel(x["out"], out64) < OUT_LIMIT and rel(x["final_state"], final64) < FP32_STATE_LIMIT


@pytest.mark.parametrize("form", list(FORMS))
def test_the_package_reference_agrees_with_the_oracle(rng, form):
    x, neg = _with_form(make_problem(rng, B=1, T=20, H=2, HV=4, state="fp32", K=32, V=16), form)
    out, final = flash_kda.reference(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"],
                                     x["dt_bias"], x["lower_bound"], x["initial_state"],
                                     allow_neg_eigval=neg)
    out64, final64 = _oracle(x, neg)
    assert rel(out, out64) < 1e-12 and rel(final, final64) < 1e-12


@pytest.mark.parametrize("form", list(FORMS))
def test_form_is_not_ignored(rng, form):
    """The default form on the same inputs is far from the oracle of the form asked for."""
    x, neg = _with_form(make_problem(rng, B=1, T=40, H=2, state="fp32"), form)
    default = make_problem(rng, B=1, T=40, H=2, state="fp32")
    default.update({n: x[n] for n in ("q", "k", "v", "g", "beta", "dt_bias", "initial_state")})
    # A rate of exp(A_log) near 1 would make the default gate the rate-1 sigmoid itself: draw the
    # default's A_log in [1, 2) (rate e to e^2) so the two forms are far apart on every seed.
    default["A_log"] = (1.0 + rng.random(default["A_log"].shape)).astype(np.float32)
    _fwd(default, False, "cpu")
    assert rel(default["out"], _oracle(x, neg)[0]) > 10 * OUT_LIMIT


# ---- extreme gates under the softplus form ---------------------------------------------------------

def _extreme(rng, kind):
    x = make_problem(rng, B=1, T=64, H=2, state="fp32")
    x["lower_bound"] = None
    x["A_log"][0] = 0.0
    if kind == "e-200-one-token":
        _set_g(x, 21, 0, 200.0)
    elif kind == "e-1e4-over-a-chunk":
        for t in range(16, 32):
            _set_g(x, t, 0, 640.0, slice(0, None, 2))
    elif kind == "infinite":
        _set_g(x, 5, 0, 1.0e4)
        _set_g(x, 40, 1, 3.0e38)
    elif kind == "no-decay":
        x["g"][...] = -1.0e4
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["e-200-one-token", "e-1e4-over-a-chunk", "infinite", "no-decay"])
def test_extreme_gates(rng, backend, kind):
    x = _extreme(rng, kind)
    _fwd(x, False, backend)
    out64, final64 = _oracle(x, False)
    assert_written("out", x["out"])
    assert_written("final_state", x["final_state"])
    assert rel(x["out"], out64) < OUT_LIMIT and rel(x["final_state"], final64) < FP32_STATE_LIMIT


# ---- decode, pools, checkpoints --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(FORMS))
def test_decode_on_a_pool(rng, backend, form):
    x, neg = _with_form(make_problem(rng, B=1, T=12, H=1, HV=2, state="fp32", cu_seqlens=[4, 1, 7]), form)
    _set_g(x, 2, 1, 200.0)  # an e^-200 decay inside the window
    P, slots = 5, np.array([4, -1, 1], np.int32)  # the second sequence is padding
    pool = poisoned((P, 2, 128, 128), np.float32)
    for n, s in enumerate(slots):
        if s >= 0:
            pool[s] = x["initial_state"][n]
    before = pool.copy()
    flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                     x["dt_bias"], x["lower_bound"], pool, slots, cu_seqlens=x["cu_seqlens"],
                     backend=backend, allow_neg_eigval=neg)
    out64, final64 = _oracle(x, neg)
    active = np.r_[0:4, 5:12]
    assert_written("out", x["out"][0, active])
    assert np.isnan(x["out"][0, 4].astype(np.float32)).all()  # padding: its rows untouched
    assert rel(x["out"][0, active], out64[0, active]) < OUT_LIMIT
    for n in (0, 2):
        assert rel(pool[slots[n]], final64[n]) < FP32_STATE_LIMIT
    for s in (0, 2, 3):
        assert pool[s].tobytes() == before[s].tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(FORMS))
def test_pool_prefill_with_checkpoints(rng, backend, form):
    x, neg = _with_form(make_problem(rng, B=1, T=60, H=1, HV=2, state="fp32", cu_seqlens=[40, 20]), form)
    _set_g(x, 15, 0, 200.0, slice(0, None, 3))  # right before the first boundary
    pool = x["initial_state"][[1, 0]].copy()  # sequence n in slot 1 - n
    slots = np.array([1, 0], np.int32)
    ckpt = poisoned((3, 2, 128, 128), np.float32)
    out64, final64, after = _oracle(x, neg, token_states=True)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                  x["dt_bias"], x["lower_bound"], pool, pool, x["cu_seqlens"], backend=backend,
                  state_indices=slots, checkpoint_interval=16, checkpoint_state=ckpt,
                  checkpoint_indices=np.array([[2, 0], [1, -1]], np.int32), allow_neg_eigval=neg)
    assert rel(x["out"], out64) < OUT_LIMIT
    for n in (0, 1):
        assert rel(pool[slots[n]], final64[n]) < FP32_STATE_LIMIT
    for slot, token in ((2, 15), (0, 31), (1, 40 + 15)):
        assert_written(f"checkpoint slot {slot}", ckpt[slot])
        assert rel(ckpt[slot], after[0, token]) < 1e-3


# ---- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_softplus_gate_needs_A_log(rng, backend):
    x = make_problem(rng, B=1, T=8, H=1, state="fp32")
    with pytest.raises(TypeError, match=r"^A_log: expected an array \(got None\); the softplus gate"):
        _fwd(dict(x, lower_bound=None, A_log=None), False, backend)
    assert np.isnan(x["out"].astype(np.float32)).all() and np.isnan(x["final_state"]).all()
    pool = np.zeros((1, 1, 128, 128), np.float32)
    with pytest.raises(TypeError, match=r"^A_log: "):
        flash_kda.decode(x["q"][:, :2], x["k"][:, :2], x["v"][:, :2], x["g"][:, :2], x["beta"][:, :2],
                         x["scale"], x["out"][:, :2], None, x["dt_bias"], None, pool,
                         np.array([0], np.int32), backend=backend)
    assert (pool == 0).all()


def test_lower_bound_range_is_checked_without_A_log(rng):
    x = make_problem(rng, B=1, T=8, H=1, state="fp32")
    with pytest.raises(ValueError, match=r"^lower_bound: "):
        _fwd(dict(x, lower_bound=-7.0, A_log=None), False, "cpu")
    assert np.isnan(x["out"].astype(np.float32)).all()


# ---- torch -------------------------------------------------------------------------------------------

def _torch(x):
    import torch

    import flash_kda.torch_ops  # noqa: F401  (registers torch.ops.flash_kda)

    t = {}
    for n, a in x.items():
        if isinstance(a, np.ndarray):
            t[n] = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16) if a.dtype == BF16 else \
                torch.from_numpy(a.copy())
        else:
            t[n] = a
    return t


@needs_torch
@pytest.mark.parametrize("form", list(FORMS))
def test_torch_operators_eager_fake_and_compiled(rng, form):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, neg = _with_form(make_problem(rng, B=1, T=40, H=2, HV=4, state="fp32", cu_seqlens=[25, 15]), form)
    t = _torch(x)
    out64, final64 = _oracle(x, neg)
    args = (t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t["A_log"], t["dt_bias"], x["lower_bound"],
            t["initial_state"], t["cu_seqlens"], None, True)
    with torch.inference_mode():
        o, final = torch.ops.flash_kda.chunk_kda(*args, neg)
        o2, final2 = flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["initial_state"],
                                         output_final_state=True, lower_bound=x["lower_bound"],
                                         cu_seqlens=t["cu_seqlens"], A_log=t["A_log"], dt_bias=t["dt_bias"],
                                         allow_neg_eigval=neg)
        out = torch.full_like(t["v"], float("nan"))
        fin = torch.full_like(t["initial_state"], float("nan"))
        torch.ops.flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], out, t["A_log"],
                                t["dt_bias"], x["lower_bound"], t["initial_state"], fin, t["cu_seqlens"],
                                allow_neg_eigval=neg)
    assert rel(o.float().numpy(), out64) < OUT_LIMIT and rel(final.numpy(), final64) < FP32_STATE_LIMIT
    assert torch.equal(o, o2) and torch.equal(final, final2) and torch.equal(o, out) and torch.equal(final, fin)

    with FakeTensorMode() as mode:  # the fake implementations accept the form and give the shapes
        f = {n: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for n, a in t.items()}
        fo, ff = torch.ops.flash_kda.chunk_kda(f["q"], f["k"], f["v"], f["g"], f["beta"], x["scale"], f["A_log"],
                                               f["dt_bias"], x["lower_bound"], f["initial_state"],
                                               f["cu_seqlens"], None, True, neg)
        assert fo.shape == t["v"].shape and ff.shape == t["initial_state"].shape

    def layer(q, k, v, g, beta, A_log, dt_bias, h0, cu):
        return flash_kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   lower_bound=x["lower_bound"], cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias,
                                   allow_neg_eigval=neg)

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    with torch.inference_mode():
        oc, fc = compiled(t["q"], t["k"], t["v"], t["g"], t["beta"], t["A_log"], t["dt_bias"], t["initial_state"],
                          t["cu_seqlens"])
    assert torch.equal(oc, o) and torch.equal(fc, final)


@needs_torch
def test_fake_decode_accepts_the_softplus_gate(rng):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make_problem(rng, B=2, T=1, H=1, state="fp32")
    t = _torch(x)
    with FakeTensorMode() as mode:
        f = {n: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for n, a in t.items()}
        pool = mode.from_tensor(torch.zeros(3, 1, 128, 128))
        torch.ops.flash_kda.decode(f["q"], f["k"], f["v"], f["g"], f["beta"], x["scale"], f["out"], f["A_log"],
                                   f["dt_bias"], None, pool, mode.from_tensor(torch.tensor([0, 2], dtype=torch.int32)),
                                   allow_neg_eigval=True)
        with pytest.raises(TypeError, match=r"^A_log: "):
            torch.ops.flash_kda.decode(f["q"], f["k"], f["v"], f["g"], f["beta"], x["scale"], f["out"], None,
                                       f["dt_bias"], None, pool,
                                       mode.from_tensor(torch.tensor([0, 2], dtype=torch.int32)))


@needs_torch
def test_chunk_kda_kimi_linear_call(rng):
    """fla's arguments of a Kimi-Linear layer: safe_gate=False, no lower_bound, A_log and dt_bias."""
    import torch

    x = make_problem(rng, B=1, T=50, H=2, state="fp32")
    x["lower_bound"] = None
    t = _torch(x)
    with torch.inference_mode():
        o, ht = flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["initial_state"],
                                    output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                    safe_gate=False, A_log=t["A_log"], dt_bias=t["dt_bias"])
        with pytest.raises(ValueError, match=r"^safe_gate: "):
            flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], safe_gate=True, A_log=t["A_log"],
                                dt_bias=t["dt_bias"])
        with pytest.raises(TypeError, match=r"^A_log: "):
            flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], dt_bias=t["dt_bias"])
    out64, final64 = _oracle(x, False)
    assert rel(o.float().numpy(), out64) < OUT_LIMIT and rel(ht.numpy(), final64) < FP32_STATE_LIMIT


# ---- CUDA: decode in every form, the forward in every form but the softplus gate ---------------------

def _cuda_ready():
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available() and flash_kda.cuda_available()


needs_cuda = pytest.mark.skipif(not _cuda_ready(),
                                reason="needs torch with CUDA and a CUDA build of flash-kda on an sm_90 GPU")
CUDA_FORWARD_FORMS = list(FORMS)
DECODE_GATES = {  # extreme softplus gates inside the decode window (docs/spec.md, "Gate forms")
    "plain": lambda x: None,
    "e-200-one-token": lambda x: _set_g(x, 2, 1, 200.0),
    "e-1e4-over-the-window": lambda x: [_set_g(x, t, 0, 1450.0, slice(1, None, 2)) for t in range(5, 12)],
    "infinite": lambda x: (_set_g(x, 1, 0, 1.0e4), _set_g(x, 9, 1, 3.0e38)),
    "no-decay": lambda x: x["g"].__setitem__(Ellipsis, -1.0e4),
}


def _cuda_tensors(x):
    from test_torch_ops import to_torch

    return to_torch(x, "cuda")


def _host(t):
    from test_torch_ops import to_numpy

    return to_numpy(t)


DECODE_CASES = [(form, "plain") for form in FORMS] + [
    (form, gate) for form in ("softplus", "softplus-neg-eigval") for gate in DECODE_GATES if gate != "plain"]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("form,gate", DECODE_CASES, ids=[f"{f}-{g}" for f, g in DECODE_CASES])
def test_cuda_decode_matches_oracle(rng, form, gate):
    """The CUDA decode in every form against the float64 oracle, on a pool with a padding sequence;
    the softplus forms also under extreme gates (no NaN or Inf, the tolerances of docs/spec.md)."""
    x, neg = _with_form(make_problem(rng, B=1, T=12, H=1, HV=2, state="fp32", cu_seqlens=[4, 1, 7]), form)
    if gate != "plain":
        x["A_log"][:] = 0.0  # rate 1: the g values above are the decays
    DECODE_GATES[gate](x)
    P, slots = 5, np.array([4, -1, 1], np.int32)  # the second sequence is padding
    pool = poisoned((P, 2, 128, 128), np.float32)
    for n, s in enumerate(slots):
        if s >= 0:
            pool[s] = x["initial_state"][n]
    x["state"], x["state_indices"] = pool, slots
    t = _cuda_tensors(x)
    flash_kda.decode(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t["out"], t["A_log"], t["dt_bias"],
                     x["lower_bound"], t["state"], t["state_indices"], cu_seqlens=t["cu_seqlens"],
                     allow_neg_eigval=neg)
    out, after = _host(t["out"]), _host(t["state"])
    out64, final64 = _oracle(x, neg)
    active = np.r_[0:4, 5:12]
    assert_written("out", out[0, active])
    assert np.isnan(out[0, 4].astype(np.float32)).all()  # padding: its rows untouched
    assert rel(out[0, active], out64[0, active]) < OUT_LIMIT
    for n in (0, 2):
        assert_written(f"slot {slots[n]}", after[slots[n]])
        assert rel(after[slots[n]], final64[n]) < FP32_STATE_LIMIT
    for s in (0, 2, 3):
        assert after[s].tobytes() == pool[s].tobytes()


def _check_cuda_forward(x, neg):
    """The CUDA forward of problem x against the float64 oracle: every element written, the
    tolerances of docs/spec.md."""
    t = _cuda_tensors(x)
    _fwd(t, neg, "cuda")
    out, final = _host(t["out"]), _host(t["final_state"])
    out64, final64 = _oracle(x, neg)
    assert_written("out", out)
    assert_written("final_state", final)
    assert rel(out, out64) < OUT_LIMIT and rel(final, final64) < FP32_STATE_LIMIT


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("form", CUDA_FORWARD_FORMS)
@pytest.mark.parametrize("layout", ["fixed", "varlen-gva"])
def test_cuda_forward_matches_oracle(rng, form, layout):
    if layout == "fixed":
        x = make_problem(rng, B=2, T=37, H=2, state="fp32")
    else:
        x = make_problem(rng, B=1, T=90, H=2, HV=4, state="fp32", cu_seqlens=[50, 0, 39, 1])
    x, neg = _with_form(x, form)
    _check_cuda_forward(x, neg)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("form", ["softplus", "softplus-neg-eigval"])
@pytest.mark.parametrize("gate", [g for g in DECODE_GATES if g != "plain"])
def test_cuda_forward_softplus_extremes(rng, form, gate):
    """The CUDA forward's softplus gate under extreme gates (e^-200 in one token, e^-1e4 over 7
    tokens, an infinite decay, none at all; docs/spec.md, "Gate forms"), chunks cut by the sequence
    ends: no NaN or Inf, every element written, the tolerances of docs/spec.md."""
    x, neg = _with_form(make_problem(rng, B=1, T=40, H=1, HV=2, state="fp32", cu_seqlens=[20, 3, 17]), form)
    x["A_log"][:] = 0.0  # rate 1: the g values of DECODE_GATES are the decays
    DECODE_GATES[gate](x)
    _check_cuda_forward(x, neg)
