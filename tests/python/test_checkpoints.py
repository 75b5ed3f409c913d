"""Prefix-cache checkpoints of flash_kda.fwd (checkpoint_interval / checkpoint_state /
checkpoint_indices / checkpoint_start; docs/spec.md, Extensions) on the host backends: every
checkpoint equals the state of the float64 NumPy oracle (tests/python/oracle.py) after the same
tokens, slots no boundary names keep their bytes, a prefill resumed from a checkpoint continues the
uninterrupted one, bad calls are rejected before anything is written. NumPy arrays and torch CPU
tensors (fwd, the custom operators, chunk_kda, torch.compile)."""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from conftest import BF16, OUT_LIMIT, STATE_DTYPES, make_problem, poisoned, rel, state_limit
from oracle import recurrence

try:
    import torch
except ImportError:  # the NumPy tests run without torch
    torch = None
else:
    import flash_kda.torch_ops  # noqa: F401  (registers the operators)
    from test_torch_ops import bits, to_torch

H, HV, K, V = 2, 4, 32, 16
BACKENDS = ["cpu", "reference"]
LIMITS = {"fp32": 1e-3, "bf16": 5e-3}  # a checkpoint against the float64 state after its tokens
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


# ---- helpers -------------------------------------------------------------------------------------

def _bytes_equal(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _patterned_pool(P, dtype):
    """A pool of P slots of distinct finite values: an untouched slot compares byte for byte."""
    return (np.arange(P * HV * V * K, dtype=np.float32).reshape(P, HV, V, K) % 4099 + 1000).astype(dtype)


def _spans(x):
    """(row, begin, end) of each sequence of the problem."""
    if x["cu_seqlens"] is None:
        return [(b, 0, x["q"].shape[1]) for b in range(x["q"].shape[0])]
    cu = [int(c) for c in x["cu_seqlens"]]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def _boundaries(start, length, interval):
    """Local token counts after which a sequence checkpoints, written from the definition: every
    absolute multiple of the interval B with start < B <= start + length."""
    return [B - start for B in range(interval, start + length + 1, interval) if B > start]


def _fwd(x, backend=None, **kw):
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                  x["dt_bias"], x["lower_bound"], x["initial_state"], x["final_state"], x["cu_seqlens"],
                  backend=backend, **kw)


def _check(x, pool, before, slots, starts, interval, dtype_name, token_states):
    """Every checkpoint of the call against the oracle's state after its tokens; every other slot
    byte for byte. Returns the number of checkpoints written."""
    written = set()
    for n, (row, begin, end) in enumerate(_spans(x)):
        start = 0 if starts is None else int(starts[n])
        for m, b in enumerate(_boundaries(start, end - begin, interval)):
            if m >= slots.shape[1] or slots[n, m] < 0:
                continue
            s = int(slots[n, m])
            written.add(s)
            got = np.asarray(pool[s], dtype=np.float64)
            assert np.isfinite(got).all(), f"slot {s} (sequence {n}, boundary {m}) not written"
            err = rel(got, token_states[row, begin + b - 1])
            assert err <= LIMITS[dtype_name], f"slot {s} (sequence {n}, boundary {m}): rel {err:.2e}"
    for s in range(pool.shape[0]):
        if s not in written:
            assert _bytes_equal(pool[s], before[s]), f"slot {s} is named by no boundary but was written"
    return len(written)


# ---- checkpoints equal the oracle's states -----------------------------------------------------------

LAYOUTS = {
    # starts off the interval, a boundary at the last token (sequences 3 and 4), an empty sequence,
    # more boundaries than columns (sequence 0: 4 boundaries, 3 columns), -1 slots, no boundary (5)
    "varlen": dict(problem=dict(B=1, T=70 + 0 + 33 + 16 + 5 + 14, cu_seqlens=[70, 0, 33, 16, 5, 14]),
                   interval=16, starts=[5, 100, 16, 0, 11, 17],
                   slots=[[3, -1, 7], [0, 1, 2], [9, 4, 5], [6, 8, 10], [11, -1, -1], [-1, -1, -1]],
                   written=6),
    "varlen-int32-starts": dict(problem=dict(B=1, T=147, cu_seqlens=[100, 47], cu_dtype=np.int32),
                                interval=48, starts=np.array([40, 1], np.int32),
                                slots=[[0, 2, 4], [1, 3, 5]], written=3),
    "batch": dict(problem=dict(B=3, T=40), interval=32, starts=[0, 30, 64], slots=[[1, 2], [3, 4], [5, 0]],
                  written=4),
    "batch-no-starts": dict(problem=dict(B=2, T=33), interval=16, starts=None,
                            slots=[[0, 1, 2], [3, -1, 5]], written=3),
}


@pytest.mark.parametrize("with_state", [True, False], ids=["initial-state", "zeros"])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoints_match_oracle(rng, backend, layout, state, with_state):
    case = LAYOUTS[layout]
    dtype = STATE_DTYPES[state]
    x = make_problem(rng, H=H, HV=HV, K=K, V=V, state=state if with_state else None, **case["problem"])
    slots = np.array(case["slots"], np.int32)
    starts = None if case["starts"] is None else np.asarray(case["starts"])
    if starts is not None and starts.dtype != np.int32:
        starts = starts.astype(np.int64)
    pool = _patterned_pool(12, dtype)
    before = pool.copy()
    _fwd(x, backend, checkpoint_interval=case["interval"], checkpoint_state=pool, checkpoint_indices=slots,
         checkpoint_start=starts)
    out64, final64, states64 = recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"],
                                          x["dt_bias"], x["lower_bound"], x["initial_state"], x["cu_seqlens"],
                                          token_states=True)
    assert _check(x, pool, before, slots, starts, case["interval"], state, states64) == case["written"]
    assert rel(x["out"], out64) <= OUT_LIMIT
    if with_state:
        assert rel(x["final_state"], final64) <= state_limit(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_stride_and_numpy_integer_interval(rng, backend):
    """checkpoint_indices may be a view whose rows are further apart than M."""
    x = make_problem(rng, B=1, T=54, H=H, HV=HV, K=K, V=V, cu_seqlens=[34, 20])
    wide = np.full((2, 7), 99, np.int32)  # 99: outside the pool, in columns never read
    wide[:, :2] = [[0, 1], [2, 3]]
    pool = _patterned_pool(4, np.float32)
    before = pool.copy()
    _fwd(x, backend, checkpoint_interval=np.int64(16), checkpoint_state=pool, checkpoint_indices=wide[:, :2],
         checkpoint_start=np.array([0, 3], np.int64))
    states64 = recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"], x["dt_bias"],
                          x["lower_bound"], None, x["cu_seqlens"], token_states=True)[2]
    assert _check(x, pool, before, wide[:, :2], [0, 3], 16, "fp32", states64) == 3


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoints_into_the_state_pool(rng, backend, state):
    """checkpoint_state is the state pool (state_indices, in place): checkpoints go to free slots."""
    dtype = STATE_DTYPES[state]
    x = make_problem(rng, B=1, T=60, H=H, HV=HV, K=K, V=V, cu_seqlens=[40, 20])
    pool = _patterned_pool(8, dtype)
    pool[[6, 2]] = rng.standard_normal((2, HV, V, K), dtype=np.float32).astype(dtype)
    init = pool[[6, 2]].copy()
    before = pool.copy()
    idx, slots = np.array([6, 2], np.int32), np.array([[0, 3, 5], [7, 1, 4]], np.int32)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"], x["dt_bias"],
                  x["lower_bound"], pool, pool, x["cu_seqlens"], backend=backend, state_indices=idx,
                  checkpoint_interval=16, checkpoint_state=pool, checkpoint_indices=slots,
                  checkpoint_start=np.array([8, 0]))
    _, final64, states64 = recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["A_log"],
                                      x["dt_bias"], x["lower_bound"], init, x["cu_seqlens"], token_states=True)
    for s, token in ((0, 8), (3, 24), (5, 40), (7, 40 + 16)):
        assert rel(pool[s], states64[0, token - 1]) <= LIMITS[state], f"slot {s}"
    assert rel(pool[6], final64[0]) <= state_limit(dtype) and rel(pool[2], final64[1]) <= state_limit(dtype)
    for s in (1, 4):  # named by boundaries the sequence does not reach
        assert _bytes_equal(pool[s], before[s])


# ---- resuming from a checkpoint -----------------------------------------------------------------------

@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_from_a_checkpoint(rng, backend, state):
    """A second prefill from a checkpoint (initial_state = the slot, checkpoint_start = the boundary)
    on the remaining tokens gives what the uninterrupted prefill gave: out and the checkpoints and
    final state after it."""
    dtype, start, interval, T = STATE_DTYPES[state], 3, 32, 109
    x = make_problem(rng, B=1, T=T, H=H, HV=HV, K=K, V=V)
    pool = _patterned_pool(4, dtype)
    final = poisoned((1, HV, V, K), np.float32)
    x["final_state"] = final
    _fwd(x, backend, checkpoint_interval=interval, checkpoint_state=pool,
         checkpoint_indices=np.array([[0, 1, 2]], np.int32), checkpoint_start=np.array([start]))
    # boundaries at absolute 32, 64, 96: after 29, 61, 93 tokens
    tol = OUT_LIMIT if state == "fp32" else 6e-3
    for m, done in enumerate((29, 61, 93)):
        rest = {n: (a[:, done:] if n in ("q", "k", "v", "g", "beta") else a) for n, a in x.items()}
        rest["out"] = poisoned(rest["v"].shape, BF16)
        rest["initial_state"] = pool[m:m + 1]
        rest["final_state"] = poisoned((1, HV, V, K), np.float32)
        later = np.full((1, 3), -1, np.int32)
        later[0, :2 - m] = [3, 2][:2 - m] if m < 2 else []
        pool2 = poisoned(pool.shape, dtype)  # a slot the resumed call should write and does not stays NaN
        _fwd(rest, backend, checkpoint_interval=interval, checkpoint_state=pool2, checkpoint_indices=later,
             checkpoint_start=np.array([start + done], np.int64))
        assert rel(rest["out"], x["out"][:, done:]) <= tol, f"resumed from checkpoint {m}"
        assert rel(rest["final_state"], final) <= (2e-3 if state == "fp32" else 6e-3)
        for j in range(2 - m):  # the later boundaries, checkpointed again by the resumed call
            assert rel(pool2[later[0, j]], pool[m + 1 + j]) <= LIMITS[state]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_then_decode(rng, backend):
    """Prefill with checkpoints, resume a second request from one, decode a token after it: the
    decoded output equals the uninterrupted prefill of the same tokens."""
    x = make_problem(rng, B=1, T=41, H=H, HV=HV, K=K, V=V)
    full_out = poisoned(x["out"].shape, BF16)
    _fwd(dict(x, out=full_out), backend)
    ckpt = poisoned((1, HV, V, K), np.float32)
    first = {n: (a[:, :32] if n in ("q", "k", "v", "g", "beta", "out") else a) for n, a in x.items()}
    first["out"] = poisoned(first["v"].shape, BF16)
    _fwd(first, backend, checkpoint_interval=32, checkpoint_state=ckpt, checkpoint_indices=np.zeros((1, 1), np.int32))
    pool = ckpt.copy()  # the second request's state: a copy of the checkpoint
    rest = {n: (a[:, 32:40] if n in ("q", "k", "v", "g", "beta") else a) for n, a in x.items()}
    rest["out"] = poisoned(rest["v"].shape, BF16)
    _fwd(dict(rest, initial_state=pool, final_state=pool), backend)
    step = {n: (a[:, 40:41] if n in ("q", "k", "v", "g", "beta") else a) for n, a in x.items()}
    out1 = poisoned(step["v"].shape, BF16)
    flash_kda.decode(step["q"], step["k"], step["v"], step["g"], step["beta"], x["scale"], out1, x["A_log"],
                     x["dt_bias"], x["lower_bound"], pool, np.zeros(1, np.int32), backend=backend)
    assert rel(rest["out"], full_out[:, 32:40]) <= OUT_LIMIT
    assert rel(out1, full_out[:, 40:41]) <= OUT_LIMIT


# ---- rejections ------------------------------------------------------------------------------------

def _error_case(rng):
    x = make_problem(rng, B=1, T=60, H=H, HV=HV, K=K, V=V, cu_seqlens=[40, 20])
    x["initial_state"] = x["final_state"] = _patterned_pool(4, np.float32)
    kw = dict(state_indices=np.array([1, 3], np.int32), checkpoint_interval=16,
              checkpoint_state=_patterned_pool(6, np.float32), checkpoint_indices=np.array([[0, 1], [2, 3]], np.int32),
              checkpoint_start=np.array([3, 16], np.int64))
    return x, kw


def _bad_calls(x, kw):
    ck, pool = kw["checkpoint_state"], x["initial_state"]
    ro = ck.copy()
    ro.flags.writeable = False
    return [
        # (changes to the keyword arguments, exception, message start)
        (dict(checkpoint_interval=8), ValueError, "checkpoint_interval: must be a positive multiple of 16"),
        (dict(checkpoint_interval=-16), ValueError, "checkpoint_interval: must be a positive multiple of 16"),
        (dict(checkpoint_interval=16.0), TypeError, "checkpoint_interval: expected an integer"),
        (dict(checkpoint_interval=True), TypeError, "checkpoint_interval: expected an integer"),
        (dict(checkpoint_interval="16"), TypeError, "checkpoint_interval: expected an integer"),
        (dict(checkpoint_interval=None), ValueError, "checkpoint_state: given without checkpoint_interval"),
        (dict(checkpoint_interval=0), ValueError, "checkpoint_state: given without checkpoint_interval"),
        (dict(checkpoint_interval=None, checkpoint_state=None), ValueError,
         "checkpoint_indices: given without checkpoint_interval"),
        (dict(checkpoint_state=None), TypeError, "checkpoint_state: expected an array"),
        (dict(checkpoint_indices=None), TypeError, "checkpoint_indices: expected an array"),
        (dict(checkpoint_state=ck.astype(np.float16)), TypeError, "checkpoint_state: dtype must be fp32 or bf16"),
        (dict(checkpoint_state=ck[:, :2]), ValueError, "checkpoint_state: expected shape [P2, HV, V, K]"),
        (dict(checkpoint_state=ck[0]), ValueError, "checkpoint_state: expected shape [P2, HV, V, K]"),
        (dict(checkpoint_state=np.swapaxes(ck, 2, 3).copy().swapaxes(2, 3)), ValueError,
         "checkpoint_state: must be contiguous"),
        (dict(checkpoint_state=ro), ValueError, "checkpoint_state: array is read-only"),
        (dict(checkpoint_indices=kw["checkpoint_indices"].astype(np.int64)), TypeError,
         "checkpoint_indices: dtype must be int32"),
        (dict(checkpoint_indices=kw["checkpoint_indices"][:, 0].copy()), ValueError,
         "checkpoint_indices: expected shape [N, M]"),
        (dict(checkpoint_indices=np.zeros((3, 2), np.int32)), ValueError, "checkpoint_indices: expected shape [N, M]"),
        (dict(checkpoint_indices=np.array([[0, 4], [1, 5]], np.int32).T), ValueError,
         "checkpoint_indices: the last dimension must be contiguous"),
        (dict(checkpoint_indices=np.array([[0, 1], [2, 6]], np.int32)), ValueError,
         "checkpoint_indices: entry [1, 1] is 6, outside [-1, 6)"),
        (dict(checkpoint_indices=np.array([[0, -2], [2, 3]], np.int32)), ValueError,
         "checkpoint_indices: entry [0, 1] is -2"),
        (dict(checkpoint_indices=np.array([[0, 1], [1, 3]], np.int32)), ValueError,
         "checkpoint_indices: slot 1 is written twice"),
        (dict(checkpoint_start=np.array([3, 16], np.float32)), TypeError, "checkpoint_start: dtype must be int64 or int32"),
        (dict(checkpoint_start=np.array([3], np.int64)), ValueError, "checkpoint_start: expected shape [N] = [2]"),
        (dict(checkpoint_start=np.array([-3, 16], np.int64)), ValueError, "checkpoint_start: entry 0 is -3"),
        # the state pool as checkpoint pool: checkpoints must avoid the slots the call uses as states
        (dict(checkpoint_state=pool, checkpoint_indices=np.array([[0, 3], [2, -1]], np.int32)), ValueError,
         "checkpoint_indices: slot 3 (sequence 0, column 1) is the state slot of sequence 1"),
        (dict(checkpoint_state=pool, checkpoint_indices=np.array([[1, 0], [2, -1]], np.int32)), ValueError,
         "checkpoint_indices: slot 1 (sequence 0, column 0) is the state slot of sequence 0"),
        (dict(checkpoint_state=pool[1:], checkpoint_indices=np.array([[0, -1], [-1, -1]], np.int32)), ValueError,
         "final_state: overlaps checkpoint_state"),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejections_name_the_argument_and_write_nothing(rng, backend):
    x, kw = _error_case(rng)
    _fwd(dict(x, out=x["out"].copy(), initial_state=x["initial_state"].copy(), final_state=None), backend,
         **dict(kw, checkpoint_state=kw["checkpoint_state"].copy()))  # the base call is valid
    for change, exc, start in _bad_calls(x, kw):
        args = dict(kw, **change)
        watched = [x["out"], x["initial_state"], kw["checkpoint_state"]]
        before = [a.copy() for a in watched]
        with pytest.raises(exc) as e:
            _fwd(x, backend, **args)
        assert str(e.value).startswith(start), (change.keys(), str(e.value))
        for a, b in zip(watched, before):
            assert _bytes_equal(a, b), f"{list(change)}: a rejected call wrote"


def test_the_cpu_check_covers_views_of_the_same_memory(rng):
    """A checkpoint pool that overlaps an input (here q's memory viewed as a pool) is rejected."""
    x, kw = _error_case(rng)
    raw = np.zeros(HV * V * K * 2 + 64, np.float32)
    x["q"] = raw.view(BF16)[:x["q"].size].reshape(x["q"].shape)
    with pytest.raises(ValueError, match=r"^checkpoint_state: overlaps q"):
        _fwd(x, "cpu", **dict(kw, checkpoint_state=raw[:HV * V * K].reshape(1, HV, V, K),
                              checkpoint_indices=np.array([[0, -1], [-1, -1]], np.int32)))


# ---- torch: fwd, the operators, chunk_kda, fake tensors, torch.compile --------------------------------

def _torch_case(rng):
    x = make_problem(rng, B=1, T=60, H=H, HV=HV, K=K, V=V, cu_seqlens=[40, 20], state="fp32")
    x["checkpoint_state"] = _patterned_pool(5, np.float32)
    x["checkpoint_indices"] = np.array([[0, 1], [2, 3]], np.int32)
    x["checkpoint_start"] = np.array([3, 16], np.int64)
    return x


@needs_torch
def test_torch_routes_agree(rng):
    """flash_kda.fwd on tensors, the checkpointed operators and chunk_kda write the same checkpoints as
    the NumPy call, bit for bit, and leave slot 4 alone."""
    x = _torch_case(rng)
    ref_pool = x["checkpoint_state"].copy()
    _fwd(dict(x), "cpu", checkpoint_interval=16, checkpoint_state=ref_pool,
         checkpoint_indices=x["checkpoint_indices"], checkpoint_start=x["checkpoint_start"])
    want = torch.from_numpy(ref_pool)
    t = to_torch(x)
    ck = dict(checkpoint_interval=16, checkpoint_indices=t["checkpoint_indices"],
              checkpoint_start=t["checkpoint_start"])

    pool = t["checkpoint_state"].clone()
    flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"], t["dt_bias"],
                  t["lower_bound"], t["initial_state"], t["final_state"], t["cu_seqlens"], checkpoint_state=pool, **ck)
    assert torch.equal(bits(pool), bits(want))

    pool = t["checkpoint_state"].clone()
    torch.ops.flash_kda.fwd_checkpointed(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"],
                                         t["A_log"], t["dt_bias"], t["lower_bound"], t["initial_state"],
                                         t["final_state"], t["cu_seqlens"], None, None, None, None, pool,
                                         t["checkpoint_indices"], t["checkpoint_start"], 16)
    assert torch.equal(bits(pool), bits(want))

    pool = t["checkpoint_state"].clone()
    with torch.inference_mode():
        o, final = flash_kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=t["scale"],
                                       initial_state=t["initial_state"], output_final_state=True,
                                       lower_bound=t["lower_bound"], cu_seqlens=t["cu_seqlens"], A_log=t["A_log"],
                                       dt_bias=t["dt_bias"], checkpoint_state=pool, **ck)
    assert torch.equal(bits(pool), bits(want))
    assert torch.equal(bits(o), bits(t["out"])) and torch.equal(bits(final), bits(t["final_state"]))

    pool = t["checkpoint_state"].clone()
    o2, _ = torch.ops.flash_kda.chunk_kda_checkpointed(
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["A_log"], t["dt_bias"], t["lower_bound"],
        t["initial_state"], t["cu_seqlens"], None, True, pool, t["checkpoint_indices"], t["checkpoint_start"], 16)
    assert torch.equal(bits(pool), bits(want)) and torch.equal(bits(o2), bits(o))


@needs_torch
def test_operator_schemas_declare_the_checkpoint_pool_mutated():
    # ... and give no argument up to the last mutated one a default (torch before 2.12 drops trailing
    # defaulted arguments, then indexes the mutated ones; torch_ops.py): only arguments added after
    # checkpoint_interval (allow_neg_eigval) have one.
    fwd_schema = str(torch.ops.flash_kda.fwd_checkpointed.default._schema)
    chunk_schema = str(torch.ops.flash_kda.chunk_kda_checkpointed.default._schema)
    for schema in (fwd_schema, chunk_schema):
        assert "!)? checkpoint_state," in schema and "SymInt? checkpoint_interval," in schema
        head, tail = schema.split("SymInt? checkpoint_interval")
        assert "=" not in head and tail.startswith(", bool allow_neg_eigval=False)")
    assert "checkpoint" not in str(torch.ops.flash_kda.fwd.default._schema)
    assert "checkpoint" not in str(torch.ops.flash_kda.chunk_kda.default._schema)


@needs_torch
def test_opcheck_with_checkpoints(rng):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch>=2.4")
    t = to_torch(_torch_case(rng))
    torch.library.opcheck(torch.ops.flash_kda.fwd_checkpointed.default, (
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"], t["dt_bias"],
        t["lower_bound"], t["initial_state"], t["final_state"], t["cu_seqlens"], None, None, None, None,
        t["checkpoint_state"], t["checkpoint_indices"], t["checkpoint_start"], 16))
    torch.library.opcheck(torch.ops.flash_kda.chunk_kda_checkpointed.default, (
        t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["A_log"], t["dt_bias"], t["lower_bound"],
        t["initial_state"], t["cu_seqlens"], None, True, t["checkpoint_state"], t["checkpoint_indices"],
        t["checkpoint_start"], 16))


@needs_torch
def test_fake_tensors_run_the_checks(rng, device="cpu"):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = _torch_case(rng)
    with FakeTensorMode(allow_non_fake_inputs=False):
        t = {n: (torch.empty_like(a, device=device) if isinstance(a, torch.Tensor) else a)
             for n, a in to_torch(x).items()}

        def call(**kw):
            a = dict(dict(checkpoint_interval=16, checkpoint_state=t["checkpoint_state"],
                          checkpoint_indices=t["checkpoint_indices"], checkpoint_start=t["checkpoint_start"]), **kw)
            flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"],
                          t["dt_bias"], t["lower_bound"], t["initial_state"], t["final_state"], t["cu_seqlens"], **a)

        call()
        with pytest.raises(ValueError, match=r"^checkpoint_interval: must be a positive multiple of 16"):
            call(checkpoint_interval=40)
        with pytest.raises(TypeError, match=r"^checkpoint_indices: dtype must be int32"):
            call(checkpoint_indices=t["checkpoint_indices"].long())
        with pytest.raises(ValueError, match=r"^checkpoint_state: expected shape \[P2, HV, V, K\]"):
            call(checkpoint_state=t["checkpoint_state"][:, :1])


def _ckpt_fn(q, k, v, g, beta, A_log, dt_bias, init, cu, pool, slots, starts):
    out = torch.zeros_like(v)
    flash_kda.fwd(q, k, v, g, beta, q.shape[-1] ** -0.5, out, A_log, dt_bias, -5.0, init, None, cu,
                  checkpoint_interval=16, checkpoint_state=pool, checkpoint_indices=slots, checkpoint_start=starts)
    return pool * 2  # the mutated pool is used after the call


@needs_torch
def test_compile_fullgraph_matches_eager(rng):
    torch._dynamo.reset()
    t = to_torch(_torch_case(rng))
    args = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens",
                           "checkpoint_state", "checkpoint_indices", "checkpoint_start")]
    eager_args = [a.clone() for a in args]
    compiled = torch.compile(_ckpt_fn, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():
        got = compiled(*args)
        want = _ckpt_fn(*eager_args)
    assert torch.equal(bits(got), bits(want))
    assert torch.equal(bits(args[9]), bits(eager_args[9]))
