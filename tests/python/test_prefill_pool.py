"""flash_kda.fwd on a state pool (the keyword-only state_indices and has_initial_state): equals fwd
on the gathered states, scattered back; leaves padding sequences, their out rows and unused slots
untouched byte for byte; continues into flash_kda.decode; rejects bad calls before writing. NumPy
arrays and torch CPU tensors (direct route, checked route, the custom operator, torch.compile);
tests marked `cuda` run the same on an sm_90 GPU."""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from conftest import (BF16, OUT_LIMIT, STATE_DTYPES, call, make_problem, poisoned, reference_numpy,
                      rel, state_limit, with_fresh_outputs)

try:
    import torch
except ImportError:  # the NumPy tests run without torch
    torch = None
else:
    import flash_kda.torch_ops  # noqa: F401  (registers the operators)
    from test_torch_ops import bits, to_numpy, to_torch

H, HV, K, V = 2, 2, 128, 128
BACKENDS = ["cpu", "reference"]
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
needs_cuda = pytest.mark.skipif(
    torch is None or not (torch.cuda.is_available() and flash_kda.cuda_available()),
    reason="needs torch with CUDA and a CUDA build of flash-kda on an sm_90 GPU")


# ---- helpers -------------------------------------------------------------------------------------

def _bytes_equal(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _pool(rng, P, dtype, used):
    """A pool of P slots: random states in `used`, NaN poison everywhere else (a slot that is read
    without being meant to be makes the result NaN)."""
    pool = poisoned((P, HV, V, K), dtype)
    for s in used:
        pool[s] = rng.standard_normal((HV, V, K), dtype=np.float32).astype(dtype)
    return pool


def _rows(x, n):
    """The index of sequence n's rows of out (and of every activation)."""
    if x["cu_seqlens"] is None:
        return (n,)
    cu = x["cu_seqlens"]
    return (0, slice(int(cu[n]), int(cu[n + 1])))


def _num_seqs(x):
    return x["q"].shape[0] if x["cu_seqlens"] is None else len(x["cu_seqlens"]) - 1


def _reads(idx, has, n):
    """Whether active sequence n starts from its slot (rather than from zeros)."""
    return has is None or bool(has[n])


def _pool_call(x, init_pool, final_pool, idx, has=None, backend=None):
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                  x["dt_bias"], x["lower_bound"], init_pool, final_pool, x["cu_seqlens"], backend=backend,
                  state_indices=idx, has_initial_state=has)


def _gathered_initial(x, init_pool, idx, has, dtype):
    """[N, HV, V, K]: each active sequence's slot (zeros where has_initial_state is 0, and for
    padding sequences)."""
    init = np.zeros((_num_seqs(x), HV, V, K), dtype=dtype)
    for n, s in enumerate(idx):
        if s >= 0 and _reads(idx, has, n):
            init[n] = init_pool[s]
    return init


def _check_pool_call(x, out_before, init_before, final_before, final_pool, idx, has, dtype, backend):
    """The pool call already ran on x (out) and final_pool: compares with plain fwd on the gathered
    states (same backend: bit for bit) and with the float64 recurrence (SPEC limits), and checks what
    must be untouched."""
    init = _gathered_initial(x, init_before, idx, has, dtype)
    y = with_fresh_outputs(dict(x, initial_state=init), dtype)
    call(y, backend=backend)
    out64, state64 = reference_numpy(dict(x, initial_state=init))
    written = set()
    for n, s in enumerate(idx):
        rows = _rows(x, n)
        if s < 0:
            assert _bytes_equal(x["out"][rows], out_before[rows]), f"out rows of padding sequence {n} written"
            continue
        written.add(int(s))
        assert _bytes_equal(x["out"][rows], y["out"][rows]), f"out rows of sequence {n} differ from fwd"
        assert _bytes_equal(final_pool[s], y["final_state"][n]), f"slot {s} differs from fwd's final state"
        if x["out"][rows].size:
            assert rel(x["out"][rows], out64[rows]) <= OUT_LIMIT
        assert rel(final_pool[s], state64[n]) <= state_limit(dtype)
    others = [s for s in range(final_pool.shape[0]) if s not in written]
    assert _bytes_equal(final_pool[others], final_before[others]), "a slot no sequence writes was written"
    return written


# ---- NumPy: pool prefill equals fwd on the gathered states ------------------------------------------

LAYOUTS = {
    # (make_problem arguments, slots: None = a permutation; negative entries are padding)
    "varlen": (dict(B=1, T=13 + 0 + 40 + 1 + 7 + 20, cu_seqlens=[13, 0, 40, 1, 7, 20]),
               [5, 0, -1, 8, -3, 2]),
    "varlen-int32": (dict(B=1, T=31, cu_seqlens=[30, 1], cu_dtype=np.int32), [1, 6]),
    "batch": (dict(B=4, T=19), [7, -1, 3, 0]),
}
HAS = {
    None: None,
    "bool": lambda N: (np.arange(N) % 3 != 1),
    "uint8": lambda N: np.array([1, 0, 7, 1, 0, 1][:N], dtype=np.uint8),  # any nonzero entry is true
}


@pytest.mark.parametrize("has_kind", list(HAS), ids=lambda k: f"has-{k}")
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "two-pools"])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_equals_gathered_fwd(rng, backend, layout, state, in_place, has_kind):
    dtype = STATE_DTYPES[state]
    kw, slots = LAYOUTS[layout]
    x = make_problem(rng, H=H, HV=HV, **kw)
    N, P = _num_seqs(x), 9
    idx = np.array(slots, dtype=np.int32)
    has = None if HAS[has_kind] is None else HAS[has_kind](N)
    # Only the slots meant to be read hold states; the others are NaN, so reading one would show.
    init_pool = _pool(rng, P, dtype, [s for n, s in enumerate(idx) if s >= 0 and _reads(idx, has, n)])
    init_before = init_pool.copy()
    final_pool = init_pool if in_place else poisoned((P, HV, V, K), dtype)
    final_before = final_pool.copy()
    out_before = x["out"].copy()
    _pool_call(x, init_pool, final_pool, idx, has, backend)
    _check_pool_call(x, out_before, init_before, final_before, final_pool, idx, has, dtype, backend)
    if not in_place:
        assert _bytes_equal(init_pool, init_before), "the initial pool was written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_gva_and_larger_pool(rng, backend):
    """HV = 2 H, a pool much larger than the batch, the only state a final pool of its own."""
    x = make_problem(rng, B=1, T=50, H=1, HV=2, cu_seqlens=[20, 30])
    P = 40
    pool = poisoned((P, 2, V, K), np.float32)
    idx = np.array([33, 4], np.int32)
    pool_before = pool.copy()
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                  x["dt_bias"], x["lower_bound"], None, pool, x["cu_seqlens"], backend=backend,
                  state_indices=idx)
    y = with_fresh_outputs(x, np.float32)
    call(y, backend=backend)
    assert _bytes_equal(x["out"], y["out"])
    assert _bytes_equal(pool[idx], y["final_state"])
    others = [s for s in range(P) if s not in (33, 4)]
    assert _bytes_equal(pool[others], pool_before[others])


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_padding_writes_nothing(rng, backend):
    x = make_problem(rng, B=3, T=10, H=H, HV=HV)
    pool = _pool(rng, 4, np.float32, range(4))
    out_before, pool_before = x["out"].copy(), pool.copy()
    _pool_call(x, pool, pool, np.array([-1, -2, -100], np.int32), np.array([1, 0, 1], np.uint8), backend)
    assert _bytes_equal(x["out"], out_before) and _bytes_equal(pool, pool_before)


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_has_initial_state_zero_equals_zero_state(rng, backend, state):
    """has_initial_state = 0 everywhere: the result of fwd without initial_state (the slots, NaN
    here, are not read), and the final states are written; also without a pool."""
    dtype = STATE_DTYPES[state]
    x = make_problem(rng, B=1, T=45, H=H, HV=HV, cu_seqlens=[25, 0, 20])
    y = with_fresh_outputs(x, dtype)
    call(y, backend=backend)  # initial_state None: zeros
    pool = poisoned((5, HV, V, K), dtype)
    idx = np.array([4, 0, 2], np.int32)
    _pool_call(x, pool, pool, idx, np.zeros(3, bool), backend)
    assert _bytes_equal(x["out"], y["out"])
    assert _bytes_equal(pool[idx], y["final_state"])
    assert np.isnan(pool[[1, 3]].astype(np.float32)).all()

    # Without a pool it selects between initial_state[n] and zeros.
    z = with_fresh_outputs(x, dtype)
    z["initial_state"] = _pool(rng, 3, dtype, [1])  # rows 0 and 2 are NaN and must not be read
    flash_kda.fwd(z["q"], z["k"], z["v"], z["g"], z["beta"], z["scale"], z["out"], z["A_log"],
                  z["dt_bias"], z["lower_bound"], z["initial_state"], z["final_state"], z["cu_seqlens"],
                  backend=backend, has_initial_state=np.array([False, True, False]))
    w = with_fresh_outputs(x, dtype)
    w["initial_state"] = np.zeros_like(z["initial_state"])
    w["initial_state"][1] = z["initial_state"][1]
    call(w, backend=backend)
    assert _bytes_equal(z["out"], w["out"]) and _bytes_equal(z["final_state"], w["final_state"])


# ---- prefill (in chunks) on the pool, then decode: one prefill of everything ---------------------

def _split_problem(x, lengths, pieces):
    """The packed problem `x` (sequence lengths `lengths`) cut into consecutive pieces: pieces[i][n]
    tokens of sequence n go to piece i. Returns one packed problem (make_problem's keys) per piece,
    with a poisoned out, and the token indices of `x` each piece covers."""
    cu = np.concatenate([[0], np.cumsum(lengths)])
    offsets = np.zeros(len(lengths), dtype=np.int64)
    result = []
    for counts in pieces:
        tokens = np.concatenate([np.arange(cu[n] + offsets[n], cu[n] + offsets[n] + c, dtype=np.int64)
                                 for n, c in enumerate(counts)])
        offsets += counts
        p = {n: (np.ascontiguousarray(x[n][:, tokens]) if n in ("q", "k", "v", "g", "beta") else x[n])
             for n in x}
        p["out"] = poisoned((1, len(tokens), HV, V), BF16)
        p["cu_seqlens"] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        p["initial_state"] = p["final_state"] = None
        result.append((p, tokens))
    assert (offsets == lengths).all()
    return result


def _prefill_then_decode(rng, backend, dtype, convert=lambda a: a, to_numpy=lambda a: a):
    """Sequence 2 is padding throughout; sequence 0 continues a request already in the pool, the
    others are new (has_initial_state 0 in the first chunk). Returns the pieces, the full problem,
    the final pool and its initial contents."""
    first = [9, 20, 3, 1, 33]
    second = [0, 17, 5, 2, 40]
    decode = [3, 1, 8, 8, 2]
    lengths = np.array(first) + np.array(second) + np.array(decode)
    x = make_problem(rng, B=1, T=int(lengths.sum()), H=H, HV=HV, cu_seqlens=list(lengths))
    pieces = _split_problem(x, lengths, [first, second, decode])
    P = 8
    idx = np.array([6, 1, -1, 3, 0], np.int32)
    pool = _pool(rng, P, dtype, [6])  # only sequence 0's slot holds a state; the rest is NaN
    before = pool.copy()
    t_pool, t_idx = convert(pool), convert(idx)
    for i, (p, _) in enumerate(pieces):
        t = {n: convert(a) for n, a in p.items()}
        if i < 2:
            has = np.array([1, 0, 1, 0, 0], np.uint8) if i == 0 else np.ones(5, bool)
            flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"],
                          t["dt_bias"], t["lower_bound"], t_pool, t_pool, t["cu_seqlens"], backend=backend,
                          state_indices=t_idx, has_initial_state=convert(has))
        else:
            flash_kda.decode(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"],
                             t["dt_bias"], t["lower_bound"], t_pool, t_idx, cu_seqlens=t["cu_seqlens"],
                             backend=backend)
        p["out"] = to_numpy(t["out"])
    return x, pieces, idx, to_numpy(t_pool), before


def _check_prefill_then_decode(x, pieces, idx, pool, before, dtype):
    init = np.zeros((len(idx), HV, V, K), np.float64)
    init[0] = before[6]
    out64, state64 = reference_numpy(dict(x, initial_state=init))
    for p, tokens in pieces:
        cu = p["cu_seqlens"]
        for n, s in enumerate(idx):
            rows = slice(int(cu[n]), int(cu[n + 1]))
            got = p["out"][0, rows]
            if s < 0:
                assert np.isnan(got.astype(np.float32)).all(), "padding rows of out were written"
            elif got.size:
                assert rel(got, out64[0, tokens[rows]]) <= OUT_LIMIT
    for n, s in enumerate(idx):
        if s >= 0:
            assert rel(pool[s], state64[n]) <= state_limit(dtype)
    assert _bytes_equal(pool[[2, 4, 5, 7]], before[[2, 4, 5, 7]])


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_then_decode_equals_one_prefill(rng, backend, state):
    dtype = STATE_DTYPES[state]
    x, pieces, idx, pool, before = _prefill_then_decode(rng, backend, dtype)
    _check_prefill_then_decode(x, pieces, idx, pool, before, dtype)


# ---- errors: the argument is named and nothing is written -------------------------------------------

def _error_problem(rng):
    x = make_problem(rng, B=1, T=24, H=H, HV=HV, cu_seqlens=[10, 0, 14])
    pool = _pool(rng, 6, np.float32, range(6))
    x["initial_state"] = x["final_state"] = pool
    x["state_indices"] = np.array([4, -1, 1], np.int32)
    x["has_initial_state"] = np.array([True, False, True])
    return x


POOL_ERRORS = [
    ("indices-int64", lambda x: {"state_indices": x["state_indices"].astype(np.int64)}, TypeError,
     "state_indices"),
    ("indices-float", lambda x: {"state_indices": x["state_indices"].astype(np.float32)}, TypeError,
     "state_indices"),
    ("indices-uint32", lambda x: {"state_indices": x["state_indices"].astype(np.uint32)}, TypeError,
     "state_indices"),
    ("indices-shape", lambda x: {"state_indices": np.array([0, 1, 2, 3], np.int32)}, ValueError,
     "state_indices"),
    ("indices-rank2", lambda x: {"state_indices": x["state_indices"][:, None]}, ValueError, "state_indices"),
    ("indices-not-contiguous", lambda x: {"state_indices": np.array([4, 9, -1, 9, 1, 9], np.int32)[::2]},
     ValueError, "state_indices"),
    ("indices-without-states", lambda x: {"initial_state": None, "final_state": None,
                                          "has_initial_state": None}, ValueError, "state_indices"),
    ("has-int32", lambda x: {"has_initial_state": x["has_initial_state"].astype(np.int32)}, TypeError,
     "has_initial_state"),
    ("has-int8", lambda x: {"has_initial_state": x["has_initial_state"].astype(np.int8)}, TypeError,
     "has_initial_state"),
    ("has-float", lambda x: {"has_initial_state": x["has_initial_state"].astype(np.float32)}, TypeError,
     "has_initial_state"),
    ("has-shape", lambda x: {"has_initial_state": np.ones(2, bool)}, ValueError, "has_initial_state"),
    ("has-rank2", lambda x: {"has_initial_state": np.ones((3, 1), bool)}, ValueError, "has_initial_state"),
    ("has-not-contiguous", lambda x: {"has_initial_state": np.ones(6, np.uint8)[::2]}, ValueError,
     "has_initial_state"),
    ("has-without-initial", lambda x: {"initial_state": None}, ValueError, "has_initial_state"),
    ("has-without-initial-no-pool", lambda x: {"initial_state": None, "state_indices": None,
                                               "final_state": np.full((3, HV, V, K), 2.0, np.float32)},
     ValueError, "has_initial_state"),
    ("pools-different-P", lambda x: {"final_state": np.full((7, HV, V, K), 2.0, np.float32)}, ValueError,
     "final_state"),
    ("pool-rank3", lambda x: {"initial_state": np.full((HV, V, K), 2.0, np.float32)}, ValueError,
     "initial_state"),
    ("pool-K", lambda x: {"initial_state": np.full((6, HV, V, K // 2), 2.0, np.float32), "final_state": None},
     ValueError, "initial_state"),
    ("pool-heads", lambda x: {"initial_state": np.full((6, HV + 1, V, K), 2.0, np.float32)}, ValueError,
     "initial_state"),
    ("final-pool-shape", lambda x: {"initial_state": None, "has_initial_state": None,
                                    "final_state": np.full((6, HV, K, V + 1), 2.0, np.float32)}, ValueError,
     "final_state"),
    ("pool-transposed", lambda x: {"initial_state": np.full((6, HV, V, K), 2.0, np.float32).swapaxes(2, 3),
                                   "final_state": None}, ValueError, "initial_state"),
    ("slot-out-of-range", lambda x: {"state_indices": np.array([4, -1, 6], np.int32)}, ValueError,
     "state_indices"),
    ("slot-far-out-of-range", lambda x: {"state_indices": np.array([2**31 - 1, 0, 1], np.int32)},
     ValueError, "state_indices"),
    ("slot-shared", lambda x: {"state_indices": np.array([1, 3, 1], np.int32)}, ValueError, "state_indices"),
    ("slot-shared-by-empty-sequence", lambda x: {"state_indices": np.array([2, 2, 5], np.int32)},
     ValueError, "state_indices"),
]

# torch's own cases: dtypes and devices NumPy has no counterpart of (`t` is the problem as tensors).
TORCH_ERRORS = [
    ("indices-int64", lambda t: {"state_indices": t["state_indices"].long()}, TypeError, "state_indices"),
    ("indices-int16", lambda t: {"state_indices": t["state_indices"].short()}, TypeError, "state_indices"),
    ("indices-meta", lambda t: {"state_indices": t["state_indices"].to("meta")}, ValueError, "state_indices"),
    ("has-meta", lambda t: {"has_initial_state": t["has_initial_state"].to("meta")}, ValueError,
     "has_initial_state"),
    ("has-int8", lambda t: {"has_initial_state": t["has_initial_state"].to(torch.int8)}, TypeError,
     "has_initial_state"),
    ("has-bf16", lambda t: {"has_initial_state": t["has_initial_state"].bfloat16()}, TypeError,
     "has_initial_state"),
    ("indices-list", lambda t: {"state_indices": [4, -1, 1]}, TypeError, "state_indices"),
    ("has-list", lambda t: {"has_initial_state": [True, False, True]}, TypeError, "has_initial_state"),
    ("indices-not-contiguous", lambda t: {"state_indices": torch.tensor([4, 0, -1, 0, 1, 0],
                                                                        dtype=torch.int32)[::2]},
     ValueError, "state_indices"),
]


def _fwd_dict(x, backend=None):
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                  x["dt_bias"], x["lower_bound"], x["initial_state"], x["final_state"], x["cu_seqlens"],
                  backend=backend, state_indices=x["state_indices"],
                  has_initial_state=x["has_initial_state"])


def _written_buffers(x):
    return [a for a in (x["out"], x["initial_state"], x["final_state"]) if a is not None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change,error,name", [e[1:] for e in POOL_ERRORS], ids=[e[0] for e in POOL_ERRORS])
def test_errors_numpy(rng, backend, change, error, name):
    x = _error_problem(rng)
    x.update(change(x))
    before = [a.copy() for a in _written_buffers(x)]
    with pytest.raises(error, match=rf"^{name}: "):
        _fwd_dict(x, backend)
    for a, b in zip(_written_buffers(x), before):
        assert _bytes_equal(a, b)


def test_valid_error_problem_runs(rng):
    """The problem the error cases change is valid as it is (so each case fails for its change)."""
    x = _error_problem(rng)
    _fwd_dict(x)
    assert not np.isnan(x["out"].astype(np.float32)).any()


# ---- torch CPU tensors ------------------------------------------------------------------------------

def _op_fwd(t):
    torch.ops.flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"],
                            t["dt_bias"], t["lower_bound"], t["initial_state"], t["final_state"],
                            t["cu_seqlens"], state_indices=t["state_indices"],
                            has_initial_state=t["has_initial_state"])


@needs_torch
@pytest.mark.parametrize("route", ["direct", "checked", "op"])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_torch_cpu_matches_numpy_bit_for_bit(rng, state, route):
    dtype = STATE_DTYPES[state]
    kw, slots = LAYOUTS["varlen"]
    x = make_problem(rng, H=H, HV=HV, **kw)
    x["initial_state"] = x["final_state"] = _pool(rng, 9, dtype, range(9))
    x["state_indices"], x["has_initial_state"] = np.array(slots, np.int32), HAS["bool"](len(slots))
    t = to_torch(x)
    assert t["initial_state"] is t["final_state"]
    _fwd_dict(x)
    if route == "op":
        _op_fwd(t)
    else:
        _fwd_dict(t, backend="cpu" if route == "checked" else None)
    assert _bytes_equal(to_numpy(t["out"]), x["out"])
    assert _bytes_equal(to_numpy(t["final_state"]), x["final_state"])


@needs_torch
def test_torch_has_initial_state_uint8_bool_and_numpy(rng):
    x = _error_problem(rng)
    results = []
    for has in (torch.tensor([True, False, True]), torch.tensor([3, 0, 1], dtype=torch.uint8),
                np.array([1, 0, 1], np.uint8)):
        t = to_torch(x)
        t["has_initial_state"] = has
        _fwd_dict(t)
        results.append((bits(t["out"]), bits(t["final_state"])))
    for out, pool in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(pool, results[0][1])


ALL_ERRORS = [("numpy-" + e[0], e[1], None) + e[2:] for e in POOL_ERRORS] + \
    [("torch-" + e[0], None, e[1]) + e[2:] for e in TORCH_ERRORS]


@needs_torch
@pytest.mark.parametrize("route", ["direct", "op"])
@pytest.mark.parametrize("change,torch_change,error,name", [e[1:] for e in ALL_ERRORS],
                         ids=[e[0] for e in ALL_ERRORS])
def test_errors_torch(rng, route, change, torch_change, error, name):
    """Every NumPy case on tensors (views of the same memory and strides) and torch's own: the
    direct route and the operator give the NumPy route's message and write nothing."""
    x = _error_problem(rng)
    if change is not None:
        x.update(change(x))
    t = to_torch(x, copy=False)
    if torch_change is not None:
        t.update(torch_change(t))
    if route == "op" and not all(t[n] is None or isinstance(t[n], torch.Tensor)
                                 for n in ("state_indices", "has_initial_state")):
        pytest.skip("the operator's schema takes tensors only")
    buffers = [a for a in (t["out"], t["initial_state"], t["final_state"]) if a is not None]
    before = [bits(a).clone() for a in buffers]
    with pytest.raises(error, match=rf"^{name}: "):
        _fwd_dict(t) if route == "direct" else _op_fwd(t)
    for a, b in zip(buffers, before):
        assert torch.equal(bits(a), b)


@needs_torch
def test_torch_prefill_then_decode_on_one_pool(rng):
    def convert(a):
        return to_torch({"a": a})["a"]
    x, pieces, idx, pool, before = _prefill_then_decode(rng, None, np.float32, convert, to_numpy)
    _check_prefill_then_decode(x, pieces, idx, pool, before, np.float32)


# ---- the custom operator: opcheck, fake tensors, torch.compile ---------------------------------------

def _op_args(t):
    return (t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"], t["dt_bias"],
            t["lower_bound"], t["initial_state"], t["final_state"], t["cu_seqlens"], None, None,
            t["state_indices"], t["has_initial_state"])


@needs_torch
def test_operator_schema():
    schema = str(torch.ops.flash_kda.fwd.default._schema)
    assert "Tensor? state_indices=None" in schema and "Tensor? has_initial_state=None" in schema


@needs_torch
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "two-pools"])
def test_opcheck(rng, in_place):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch>=2.4")
    x = _error_problem(rng)
    if not in_place:
        x["final_state"] = np.full_like(x["initial_state"], np.nan)
    t = to_torch(x)
    torch.library.opcheck(torch.ops.flash_kda.fwd.default, _op_args(t))
    t["has_initial_state"] = t["has_initial_state"].to(torch.uint8)
    torch.library.opcheck(torch.ops.flash_kda.fwd.default, _op_args(t))
    t["has_initial_state"] = None
    torch.library.opcheck(torch.ops.flash_kda.fwd.default, _op_args(t))


@needs_torch
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fake_tensors(rng, device):
    """Fake tensors (CUDA ones need no GPU): the fake implementation runs the data-free checks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = _error_problem(rng)
    with FakeTensorMode(allow_non_fake_inputs=False):
        t = {n: (torch.empty_like(a, device=device) if isinstance(a, torch.Tensor) else a)
             for n, a in to_torch(x).items()}
        t["final_state"] = t["initial_state"]
        _fwd_dict(t)
        with pytest.raises(TypeError, match=r"^state_indices: dtype must be int32"):
            _fwd_dict(dict(t, state_indices=t["state_indices"].long()))
        with pytest.raises(TypeError, match=r"^has_initial_state: dtype must be bool or uint8"):
            _fwd_dict(dict(t, has_initial_state=t["has_initial_state"].int()))
        with pytest.raises(ValueError, match=r"^final_state: expected shape \[P, HV, V, K\] with P of"):
            _fwd_dict(dict(t, final_state=t["final_state"][:5]))
        with pytest.raises(ValueError, match=r"^has_initial_state: on device meta"):
            _fwd_dict(dict(t, has_initial_state=torch.empty(3, dtype=torch.bool, device="meta")))


def _pool_fn(q, k, v, g, beta, A_log, dt_bias, pool, cu, idx, has):
    out = torch.zeros_like(v)
    flash_kda.fwd(q, k, v, g, beta, q.shape[-1] ** -0.5, out, A_log, dt_bias, -5.0, pool, pool, cu,
                  state_indices=idx, has_initial_state=has)
    return out * 2  # the mutated buffer is used after the call


@needs_torch
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compile_fullgraph_matches_eager(rng, backend):
    torch._dynamo.reset()
    x = make_problem(rng, B=1, T=30, H=H, HV=HV, cu_seqlens=[10, 12, 8])
    x["initial_state"] = _pool(rng, 6, np.float32, range(6))
    x["state_indices"], x["has_initial_state"] = np.array([4, -1, 1], np.int32), np.array([1, 1, 0], bool)
    t = to_torch(x)
    args = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens",
                           "state_indices", "has_initial_state")]
    eager_args = [a.clone() for a in args]
    compiled = torch.compile(_pool_fn, fullgraph=True, backend=backend)
    with torch.inference_mode():
        got = compiled(*args)
        want = _pool_fn(*eager_args)
    assert torch.equal(bits(got), bits(want))
    assert torch.equal(bits(args[7]), bits(eager_args[7]))  # the pool, updated in place in both
    assert (got[0, 10:22] == 0).all()  # the padding sequence's rows
    assert torch.equal(bits(args[7][[0, 2, 3, 5]]), bits(torch.from_numpy(x["initial_state"][[0, 2, 3, 5]])))


# ---- CUDA (sm_90): the kernel indexes the pool; slots outside [0, P) are padding ---------------------

@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "two-pools"])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_cuda_pool_matches_reference(rng, state, in_place):
    dtype = STATE_DTYPES[state]
    lengths = [300, 17, 0, 700, 1, 64, 129]
    x = make_problem(rng, B=1, T=sum(lengths), H=4, HV=4, cu_seqlens=lengths)
    P = 12
    # -1 and P + 3 are padding on CUDA (a slot >= P is not read or written there).
    idx = np.array([7, -1, 2, 11, P + 3, 0, 5], np.int32)
    has = np.array([1, 1, 1, 0, 1, 1, 0], bool)
    active = [n for n, s in enumerate(idx) if 0 <= s < P]
    pool = poisoned((P, 4, V, K), dtype)
    for n in active:
        if has[n]:
            pool[idx[n]] = rng.standard_normal((4, V, K), dtype=np.float32).astype(dtype)
    x["initial_state"] = pool
    x["final_state"] = pool if in_place else poisoned((P, 4, V, K), dtype)
    x["state_indices"], x["has_initial_state"] = idx, has
    t = to_torch(x, "cuda")
    _fwd_dict(t)
    torch.cuda.synchronize()
    out, final = to_numpy(t["out"]), to_numpy(t["final_state"])
    init = np.zeros((len(idx), 4, V, K), np.float64)
    for n in active:
        if has[n]:
            init[n] = pool[idx[n]]
    out64, state64 = reference_numpy(dict(x, initial_state=init))
    cu = x["cu_seqlens"]
    for n, s in enumerate(idx):
        rows = slice(int(cu[n]), int(cu[n + 1]))
        if n not in active:
            assert np.isnan(out[0, rows].astype(np.float32)).all(), f"out rows of padding sequence {n}"
            continue
        if lengths[n]:
            assert rel(out[0, rows], out64[0, rows]) <= OUT_LIMIT
        assert rel(final[s], state64[n]) <= state_limit(dtype)
    written = {int(idx[n]) for n in active}
    others = [s for s in range(P) if s not in written]
    assert _bytes_equal(final[others], x["final_state"][others])
    if not in_place:
        assert _bytes_equal(to_numpy(t["initial_state"]), pool)


@pytest.mark.cuda
@needs_cuda
def test_cuda_prefill_then_decode_on_one_pool(rng):
    def convert(a):
        return to_torch({"a": a}, "cuda")["a"]

    def back(a):
        torch.cuda.synchronize()
        return to_numpy(a)
    x, pieces, idx, pool, before = _prefill_then_decode(rng, None, np.float32, convert, back)
    _check_prefill_then_decode(x, pieces, idx, pool, before, np.float32)


@pytest.mark.cuda
@needs_cuda
def test_cuda_pool_in_a_graph_without_synchronisation(rng):
    """Captured with the slots on the device; replayed after the slots change in place."""
    x = make_problem(rng, B=1, T=120, H=2, HV=2, cu_seqlens=[100, 20])
    x["initial_state"] = x["final_state"] = _pool(rng, 4, np.float32, range(4))
    x["state_indices"], x["has_initial_state"] = np.array([3, 1], np.int32), np.array([1, 0], np.uint8)
    t = to_torch(x, "cuda")
    cu_cpu = t["cu_seqlens"].cpu()
    pool0 = t["initial_state"].clone()

    def run():
        flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"],
                      t["dt_bias"], t["lower_bound"], t["initial_state"], t["final_state"], t["cu_seqlens"],
                      cu_seqlens_cpu=cu_cpu, state_indices=t["state_indices"],
                      has_initial_state=t["has_initial_state"])
    run()  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    t["initial_state"].copy_(pool0)
    t["state_indices"].copy_(torch.tensor([0, 2], dtype=torch.int32))
    t["has_initial_state"].fill_(1)
    graph.replay()
    torch.cuda.synchronize()
    init = to_numpy(pool0)[[0, 2]]
    out64, state64 = reference_numpy(dict(x, initial_state=init))
    assert rel(to_numpy(t["out"]), out64) <= OUT_LIMIT
    pool = to_numpy(t["final_state"])
    assert rel(pool[[0, 2]], state64) <= state_limit(np.float32)
    assert _bytes_equal(pool[[1, 3]], to_numpy(pool0)[[1, 3]])
