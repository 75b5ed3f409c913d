"""flash_kda.fwd on NumPy arrays against the float64 recurrence (docs/spec.md tolerances)."""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from conftest import (BF16, OUT_LIMIT, assert_written, call, make_problem, poisoned, reference_numpy,
                      rel, state_limit, with_fresh_outputs)

# (id, make_problem arguments). Lengths are chosen off the chunk sizes (16, 32, 64) on purpose.
CASES = [
    ("batch2-T100", dict(B=2, T=100, H=2)),
    ("varlen-int64", dict(B=1, T=300 + 17 + 0 + 70 + 1, H=2, cu_seqlens=[300, 17, 0, 70, 1])),
    ("varlen-int32", dict(B=1, T=5 + 129 + 64, H=2, cu_seqlens=[5, 129, 64], cu_dtype=np.int32)),
    ("varlen-leading-empty", dict(B=1, T=33, H=1, cu_seqlens=[0, 0, 33, 0])),
    ("many-short", dict(B=1, T=40, H=2, cu_seqlens=[1, 2, 3, 4, 5, 6, 7, 12])),
    ("T1", dict(B=3, T=1, H=2)),
    ("one-long", dict(B=1, T=1000, H=1)),
    ("gva-HV4-H2", dict(B=1, T=70, H=2, HV=4)),
    ("flat-dt_bias", dict(B=1, T=50, H=2, flat_dt_bias=True)),
    ("lower_bound-0.5", dict(B=1, T=90, H=2, lower_bound=-0.5)),
]


def _check_against_reference(x, backend=None):
    """Runs `x` on `backend` and on the compiled float64 reference; compares both with SPEC limits
    and checks every output element was written."""
    ref = with_fresh_outputs(x)
    call(x, backend=backend)
    call(ref, backend="reference")
    assert_written("out", x["out"])
    assert rel(x["out"], ref["out"]) <= OUT_LIMIT
    if x["final_state"] is not None:
        assert_written("final_state", x["final_state"])
        assert rel(x["final_state"], ref["final_state"]) <= state_limit(x["final_state"].dtype)
    # ... and against the unrounded float64 NumPy recurrence, which is what docs/spec.md measures.
    out64, state64 = reference_numpy(x)
    assert rel(x["out"], out64) <= OUT_LIMIT
    if x["final_state"] is not None:
        assert rel(x["final_state"], state64) <= state_limit(x["final_state"].dtype)


@pytest.mark.parametrize("state", [None, "fp32", "bf16"])
@pytest.mark.parametrize("case", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_reference(rng, case, state):
    _check_against_reference(make_problem(rng, state=state, **case))


def test_final_state_without_initial_state(rng):
    x = make_problem(rng, B=2, T=77, H=2)
    x["final_state"] = poisoned((2, 2, 128, 128), np.float32)
    _check_against_reference(x)


@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_reference_backend_is_the_float64_recurrence(rng, state):
    """The compiled oracle against the independent NumPy one: only the final roundings differ
    (round to nearest bf16 is within 2^-9 relative per element, fp32 within 2^-24)."""
    x = make_problem(rng, B=1, T=150, H=2, state=state, cu_seqlens=[100, 0, 50])
    call(x, backend="reference")
    out64, state64 = reference_numpy(x)
    assert rel(x["out"], out64) <= 2.0 ** -9
    assert rel(x["final_state"], state64) <= (2.0 ** -9 if state == "bf16" else 1e-6)


def test_hard_inputs(rng):
    """Strong decay, large |v|, an all-zero key (the eps keeps it finite)."""
    x = make_problem(rng, B=1, T=130, H=2, state="fp32")
    x["g"] = (np.abs(x["g"].astype(np.float32)) * 8 + 4).astype(BF16)
    x["v"] = (x["v"].astype(np.float32) * 100).astype(BF16)
    x["k"][0, 7, 1] = 0
    x["q"][0, 9, 0] = 0
    _check_against_reference(x)


def test_other_head_dims(rng):
    x = make_problem(rng, B=1, T=80, H=2, K=64, V=32, state="fp32")
    _check_against_reference(x)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_empty_sequences_copy_or_zero_the_state(rng, backend):
    x = make_problem(rng, B=1, T=20, H=2, state="fp32", cu_seqlens=[0, 20, 0])
    call(x, backend=backend)
    np.testing.assert_array_equal(x["final_state"][0], x["initial_state"][0])
    np.testing.assert_array_equal(x["final_state"][2], x["initial_state"][2])
    y = with_fresh_outputs(x)
    y["initial_state"] = None
    call(y, backend=backend)
    np.testing.assert_array_equal(y["final_state"][0], 0)
    np.testing.assert_array_equal(y["final_state"][2], 0)


def test_zero_tokens(rng):
    x = make_problem(rng, B=1, T=0, H=2, state="bf16", cu_seqlens=[0, 0])
    call(x)
    np.testing.assert_array_equal(x["final_state"].view(np.uint16), x["initial_state"].view(np.uint16))


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_in_place_state(rng, state, backend):
    """final_state is initial_state: the same result as with separate buffers, bit for bit."""
    x = make_problem(rng, B=1, T=200, H=2, state=state, cu_seqlens=[150, 0, 50])
    separate = with_fresh_outputs(x)
    call(separate, backend=backend)
    state_buffer = x["initial_state"].copy()
    call(x, backend=backend, initial_state=state_buffer, final_state=state_buffer)
    np.testing.assert_array_equal(x["out"].view(np.uint16), separate["out"].view(np.uint16))
    np.testing.assert_array_equal(state_buffer.view(np.uint8), separate["final_state"].view(np.uint8))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_strided_views_are_read_in_place(rng, backend):
    """q, k, v from one packed qkv buffer, g/beta/out as views into wider buffers: the same bits as
    with contiguous copies, and nothing outside `out`'s view is touched."""
    B, T, H, K = 2, 45, 2, 128
    x = make_problem(rng, B=B, T=T, H=H, state="fp32")
    qkv = rng.standard_normal((B, T, 3, H, K), dtype=np.float32).astype(BF16)
    g_wide = rng.standard_normal((B, T, H, K + 16), dtype=np.float32).astype(BF16)
    beta_wide = rng.standard_normal((B, T, 2 * H), dtype=np.float32).astype(BF16)
    out_wide = np.full((B, T, 2 * H, K), 7.0, dtype=BF16)
    views = dict(q=qkv[:, :, 0], k=qkv[:, :, 1], v=qkv[:, :, 2], g=g_wide[..., 8:8 + K],
                 beta=beta_wide[:, :, ::2], out=out_wide[:, :, 1::2])
    assert not any(a.flags.c_contiguous for a in views.values())
    strided = dict(x, **views)
    call(strided, backend=backend)

    contiguous = with_fresh_outputs(x)
    contiguous.update({n: np.ascontiguousarray(a) for n, a in views.items() if n != "out"})
    call(contiguous, backend=backend)
    np.testing.assert_array_equal(views["out"].view(np.uint16), contiguous["out"].view(np.uint16))
    np.testing.assert_array_equal(strided["final_state"], contiguous["final_state"])
    assert (out_wide[:, :, 0::2].astype(np.float32) == 7.0).all()


def test_read_only_inputs_are_accepted(rng):
    x = make_problem(rng, B=1, T=30, H=2, state="fp32")
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"):
        x[name].flags.writeable = False
    _check_against_reference(x)


def test_poisoned_outputs_are_overwritten(rng):
    """Any bit pattern in the outputs beforehand (NaN, Inf, garbage) is replaced."""
    x = make_problem(rng, B=1, T=97, H=2, state="fp32", cu_seqlens=[60, 0, 37])
    clean = with_fresh_outputs(x)
    call(clean)
    for fill in (np.inf, -np.nan, 1e30):
        y = with_fresh_outputs(x)
        y["out"][...] = fill
        y["final_state"][...] = fill
        call(y)
        np.testing.assert_array_equal(y["out"].view(np.uint16), clean["out"].view(np.uint16))
        np.testing.assert_array_equal(y["final_state"], clean["final_state"])


def test_batch_invariance(rng):
    """A sequence gives the same bits alone as packed with others (docs/spec.md)."""
    x = make_problem(rng, B=1, T=60 + 100 + 3, H=2, state="fp32", cu_seqlens=[60, 100, 3])
    call(x)
    alone = make_problem(rng, B=1, T=100, H=2, state="fp32")
    for n in ("q", "k", "v", "g", "beta"):
        alone[n] = x[n][:, 60:160].copy()
    for n in ("A_log", "dt_bias"):
        alone[n] = x[n]
    alone["initial_state"] = x["initial_state"][1:2].copy()
    call(alone)
    np.testing.assert_array_equal(alone["out"].view(np.uint16), x["out"][:, 60:160].view(np.uint16))
    np.testing.assert_array_equal(alone["final_state"][0], x["final_state"][1])


def test_returns_none_and_accepts_keywords(rng):
    x = make_problem(rng, B=1, T=10, H=1)
    kwargs = {n: x[n] for n in ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias",
                                "lower_bound", "initial_state", "final_state", "cu_seqlens")}
    assert flash_kda.fwd(**kwargs) is None
    assert_written("out", x["out"])


def test_scalars_from_numpy(rng):
    x = make_problem(rng, B=1, T=10, H=1)
    call(x, scale=np.float32(x["scale"]), lower_bound=np.float64(-4.0))
    assert_written("out", x["out"])


def test_cuda_available_is_a_bool():
    assert isinstance(flash_kda.cuda_available(), bool)
    if not flash_kda.built_with_cuda:
        assert flash_kda.cuda_available() is False
