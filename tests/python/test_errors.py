"""Every rejected call raises TypeError/ValueError naming the argument, and writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from flash_kda import _C
from conftest import BF16, call, make_problem

B, T, H, K = 1, 24, 2, 128


def _astype(name, dtype):
    return lambda x: {name: x[name].astype(dtype)}


def _reshape(name, shape):
    return lambda x: {name: np.zeros(shape, dtype=x[name].dtype)}


def _strided_last_dim(name):
    def make(x):
        a = x[name]
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
        return {name: wide[..., ::2]}
    return make


def _transposed_state(name):
    return lambda x: {name: x[name].swapaxes(2, 3)}  # K == V: same shape, K-first strides


def _cu(values, dtype=np.int64):
    return lambda x: {"cu_seqlens": np.asarray(values, dtype=dtype)}


def _overlapping_states(x):
    buffer = np.zeros((4,) + x["initial_state"].shape[1:], dtype=np.float32)
    return {"initial_state": buffer[:3], "final_state": buffer[1:]}


def _read_only(name):
    def make(x):
        a = x[name].copy()
        a.flags.writeable = False
        return {name: a}
    return make


# (id, change to a valid varlen problem with fp32 states, exception, argument named first)
ERRORS = [
    # dtypes
    ("q-fp32", _astype("q", np.float32), TypeError, "q"),
    ("q-uint16-bits", lambda x: {"q": x["q"].view(np.uint16)}, TypeError, "q"),
    ("k-fp16", _astype("k", np.float16), TypeError, "k"),
    ("v-fp32", _astype("v", np.float32), TypeError, "v"),
    ("g-fp32", _astype("g", np.float32), TypeError, "g"),
    ("beta-fp32", _astype("beta", np.float32), TypeError, "beta"),
    ("out-fp32", _astype("out", np.float32), TypeError, "out"),
    ("A_log-fp64", _astype("A_log", np.float64), TypeError, "A_log"),
    ("dt_bias-bf16", _astype("dt_bias", BF16), TypeError, "dt_bias"),
    ("initial_state-fp64", _astype("initial_state", np.float64), TypeError, "initial_state"),
    ("final_state-fp16", _astype("final_state", np.float16), TypeError, "final_state"),
    ("cu_seqlens-float", _astype("cu_seqlens", np.float64), TypeError, "cu_seqlens"),
    ("cu_seqlens-int16", _astype("cu_seqlens", np.int16), TypeError, "cu_seqlens"),
    ("q-list", lambda x: {"q": x["q"].tolist()}, TypeError, "q"),
    ("scale-str", lambda x: {"scale": "0.1"}, TypeError, "scale"),
    ("lower_bound-str", lambda x: {"lower_bound": "-5"}, TypeError, "lower_bound"),
    # lower_bound=None is the softplus gate (docs/spec.md, "Gate forms"), which needs A_log
    ("A_log-None-softplus", lambda x: {"lower_bound": None, "A_log": None}, TypeError, "A_log"),
    # shapes
    ("q-rank3", _reshape("q", (B, T, H * K)), ValueError, "q"),
    ("k-short", _reshape("k", (B, T - 1, H, K)), ValueError, "k"),
    ("v-batch", _reshape("v", (B + 1, T, H, K)), ValueError, "v"),
    ("v-heads-not-multiple", _reshape("v", (B, T, 3, K)), ValueError, "v"),
    ("g-K", _reshape("g", (B, T, H, K - 8)), ValueError, "g"),
    ("beta-rank4", _reshape("beta", (B, T, H, 1)), ValueError, "beta"),
    ("out-V", _reshape("out", (B, T, H, K + 8)), ValueError, "out"),
    ("A_log-shape", _reshape("A_log", (H + 1,)), ValueError, "A_log"),
    ("dt_bias-shape", _reshape("dt_bias", (H, K + 1)), ValueError, "dt_bias"),
    ("initial_state-shape", _reshape("initial_state", (2, H, K, K)), ValueError, "initial_state"),
    ("final_state-shape", _reshape("final_state", (3, H, K, K - 1)), ValueError, "final_state"),
    ("cu_seqlens-2d", lambda x: {"cu_seqlens": x["cu_seqlens"][None]}, ValueError, "cu_seqlens"),
    ("cu_seqlens-empty", _cu([]), ValueError, "cu_seqlens"),
    # strides and contiguity
    ("q-last-dim-strided", _strided_last_dim("q"), ValueError, "q"),
    ("k-last-dim-strided", _strided_last_dim("k"), ValueError, "k"),
    ("v-last-dim-strided", _strided_last_dim("v"), ValueError, "v"),
    ("g-last-dim-strided", _strided_last_dim("g"), ValueError, "g"),
    ("out-last-dim-strided", _strided_last_dim("out"), ValueError, "out"),
    ("q-negative-stride", lambda x: {"q": x["q"][:, ::-1]}, ValueError, "q"),
    ("dt_bias-not-contiguous", _strided_last_dim("dt_bias"), ValueError, "dt_bias"),
    ("A_log-not-contiguous", _strided_last_dim("A_log"), ValueError, "A_log"),
    ("initial_state-not-contiguous", _transposed_state("initial_state"), ValueError, "initial_state"),
    ("final_state-not-contiguous", _transposed_state("final_state"), ValueError, "final_state"),
    ("cu_seqlens-not-contiguous", lambda x: {"cu_seqlens": np.repeat(x["cu_seqlens"], 2)[::2]},
     ValueError, "cu_seqlens"),
    ("out-read-only", _read_only("out"), ValueError, "out"),
    ("final_state-read-only", _read_only("final_state"), ValueError, "final_state"),
    ("states-overlap", _overlapping_states, ValueError, "final_state"),
    # values
    ("lower_bound-zero", lambda x: {"lower_bound": 0.0}, ValueError, "lower_bound"),
    ("lower_bound-below-5", lambda x: {"lower_bound": -5.5}, ValueError, "lower_bound"),
    ("lower_bound-nan", lambda x: {"lower_bound": float("nan")}, ValueError, "lower_bound"),
    ("scale-inf", lambda x: {"scale": float("inf")}, ValueError, "scale"),
    ("cu_seqlens-start", _cu([1, 10, 10, T]), ValueError, "cu_seqlens"),
    ("cu_seqlens-decreasing", _cu([0, 12, 10, T]), ValueError, "cu_seqlens"),
    ("cu_seqlens-end", _cu([0, 10, 10, T - 1]), ValueError, "cu_seqlens"),
    ("cu_seqlens-end-int32", _cu([0, 10, 10, T + 1], np.int32), ValueError, "cu_seqlens"),
]


def _bytes(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _valid_problem(rng):
    return make_problem(rng, B=B, T=T, H=H, state="fp32", cu_seqlens=[10, 0, T - 10])


@pytest.mark.parametrize("change,error,name", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_rejected_before_anything_is_written(rng, change, error, name):
    x = _valid_problem(rng)
    x.update(change(x))
    outputs = [a for a in (x["out"], x["final_state"], x["initial_state"]) if isinstance(a, np.ndarray)]
    for a in outputs:
        if a.flags.writeable:
            a[...] = 3.0
    before = [a.copy() for a in outputs]
    with pytest.raises(error, match=rf"^{name}: "):
        call(x)
    for a, b in zip(outputs, before):
        np.testing.assert_array_equal(_bytes(a), _bytes(b))


def test_cu_seqlens_needs_batch_1(rng):
    x = make_problem(rng, B=2, T=8, H=1)
    with pytest.raises(ValueError, match=r"^cu_seqlens: "):
        call(x, cu_seqlens=np.array([0, 8, 16]))


@pytest.mark.parametrize("backend,message", [("gpu", "backend: "), ("cuda", "backend: ")])
def test_bad_backend(rng, backend, message):
    x = make_problem(rng, B=1, T=8, H=1)
    with pytest.raises(ValueError, match=rf"^{message}"):
        call(x, backend=backend)
    assert np.isnan(x["out"].astype(np.float32)).all()


def test_positional_signature_has_no_backend(rng):
    """The 14th positional argument does not exist: backend is keyword-only."""
    x = make_problem(rng, B=1, T=8, H=1)
    args = [x[n] for n in ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias",
                           "lower_bound", "initial_state", "final_state", "cu_seqlens")]
    with pytest.raises(TypeError):
        flash_kda.fwd(*args, "cpu")


# ---- the compiled layer checks everything itself, even when called directly ----

_C_ORDER = ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias", "lower_bound",
            "initial_state", "final_state", "cu_seqlens")


def _c_call(x, undeclared=(), **kw):
    """_C.fwd on the NumPy problem `x`, bf16 arrays passed as their uint16 bits (declared as bf16
    in bf16_bits, except those named in `undeclared`)."""
    args, bits = [], 0
    for i, n in enumerate(_C_ORDER):
        a = x[n]
        if isinstance(a, np.ndarray) and a.dtype == BF16:
            if n not in undeclared:
                bits |= 1 << {"q": 0, "k": 1, "v": 2, "g": 3, "beta": 4, "out": 5}[n]
            a = a.view(np.uint16)
        args.append(a)
    return _C.fwd(*args, bf16_bits=bits, **kw)


@pytest.mark.parametrize("name,array,error", [
    ("k", np.zeros((1, T - 1, H, K), BF16), ValueError),
    ("out", np.zeros((1, T, H, K), np.float32), TypeError),
    ("final_state", np.zeros((3, H, K, 64), np.float32), ValueError),
    ("dt_bias", np.zeros((H, 2 * K), np.float32)[:, ::2], ValueError),
    ("q", np.zeros((1, T, H, 2 * K), BF16)[..., ::2], ValueError),
])
def test_binding_checks(rng, name, array, error):
    x = _valid_problem(rng)
    x[name] = array
    with pytest.raises(error, match=rf"^{name}: "):
        _c_call(x)


def test_binding_maps_status_codes(rng):
    x = _valid_problem(rng)
    with pytest.raises(ValueError, match=r"^lower_bound: "):  # kInvalidArgument from validate()
        _c_call(dict(x, lower_bound=1.0))
    with pytest.raises(ValueError, match=r"^backend: "):
        _c_call(x, backend="cuda")
    with pytest.raises(TypeError, match=r"^cu_seqlens: "):
        _c_call(dict(x, cu_seqlens=x["cu_seqlens"].astype(np.uint8)))
    with pytest.raises(TypeError, match=r"^q: dtype must be bf16 \(got uint16\)"):
        _c_call(x, undeclared=("q",))  # uint16 bits not declared bf16 are not bf16
