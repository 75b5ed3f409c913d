"""flash_kda.decode on the CPU backends: equals flash_kda.fwd over the same tokens (docs/spec.md
tolerances), touches only the slots and out rows it should, and rejects bad calls before writing."""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from conftest import BF16, OUT_LIMIT, STATE_DTYPES, make_problem, poisoned, rel, state_limit

H, HV, K, V = 2, 2, 128, 128
BACKENDS = ["cpu", "reference"]


def _pool(rng, P, dtype, used):
    """A pool of P slots: random states in `used`, NaN poison everywhere else."""
    pool = poisoned((P, HV, V, K), dtype)
    for s in used:
        pool[s] = rng.standard_normal((HV, V, K), dtype=np.float32).astype(dtype)
    return pool


def _decode(x, pool, indices, backend, **kw):
    flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                     x["dt_bias"], x["lower_bound"], pool, indices, backend=backend, **kw)


def _fwd_tokens(x, n, tokens, state, state_dtype):
    """flash_kda.fwd (the float64 reference backend) on tokens `tokens` of batch row n from `state`:
    (out [len, HV, V], final state)."""
    sl = lambda a: np.ascontiguousarray(a[n:n + 1, tokens])  # noqa: E731
    out = poisoned((1, len(range(*tokens.indices(x["q"].shape[1]))), HV, V), BF16)
    final = poisoned((1, HV, V, K), state_dtype)
    flash_kda.fwd(sl(x["q"]), sl(x["k"]), sl(x["v"]), sl(x["g"]), sl(x["beta"]), x["scale"], out,
                  x["A_log"], x["dt_bias"], x["lower_bound"], state[None], final, None, backend="reference")
    return out[0], final[0]


def _bytes_equal(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_fwd(rng, backend, T, state):
    dtype = STATE_DTYPES[state]
    N, P = 5, 9
    x = make_problem(rng, B=N, T=T, H=H, HV=HV)
    slots = rng.permutation(P)[:N].astype(np.int32)
    slots[[1, 3]] = [-1, -7]  # padding
    pool = _pool(rng, P, dtype, [s for s in slots if s >= 0])
    before, out_before = pool.copy(), x["out"].copy()
    _decode(x, pool, slots, backend)
    for n, s in enumerate(slots):
        if s < 0:
            assert _bytes_equal(x["out"][n], out_before[n]), f"padding row {n} of out was written"
            continue
        out_ref, state_ref = _fwd_tokens(x, n, slice(None), before[s], dtype)
        assert rel(x["out"][n], out_ref) <= OUT_LIMIT
        assert rel(pool[s], state_ref) <= state_limit(dtype)
    untouched = [s for s in range(P) if s not in set(slots.tolist())]
    assert _bytes_equal(pool[untouched], before[untouched]), "a slot no sequence uses was written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen(rng, backend):
    lengths = [1, 3, 0, 8, 2]
    N, P = len(lengths), 7
    x = make_problem(rng, B=1, T=sum(lengths), H=H, HV=HV, cu_seqlens=lengths, cu_dtype=np.int32)
    slots = np.array([4, 0, 6, -1, 2], dtype=np.int32)
    pool = _pool(rng, P, np.float32, [4, 0, 6, 2])
    before, out_before = pool.copy(), x["out"].copy()
    flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                     x["dt_bias"], x["lower_bound"], pool, slots, cu_seqlens=x["cu_seqlens"],
                     backend=backend)
    cu = x["cu_seqlens"]
    for n, s in enumerate(slots):
        tokens = slice(int(cu[n]), int(cu[n + 1]))
        if s < 0:
            assert _bytes_equal(x["out"][0, tokens], out_before[0, tokens])
            continue
        if lengths[n] == 0:
            assert rel(pool[s], before[s]) <= 1e-7
            continue
        out_ref, state_ref = _fwd_tokens(x, 0, tokens, before[s], np.float32)
        assert rel(x["out"][0, tokens], out_ref) <= OUT_LIMIT
        assert rel(pool[s], state_ref) <= state_limit(np.float32)
    assert _bytes_equal(pool[[1, 3, 5]], before[[1, 3, 5]])


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("with_accepted", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_speculative(rng, backend, with_accepted, strided):
    """[N, S] indices: the state after token t goes to slot indices[n, t]; equals fwd run token by
    token from the read slot."""
    N, S, T = 5, 4, 3
    P = N * S + 3
    x = make_problem(rng, B=N, T=T, H=H, HV=HV)
    buf = np.full((N, S + 3 if strided else S), -99, dtype=np.int32)
    idx = buf[:, :S]
    idx[...] = rng.permutation(P)[:N * S].reshape(N, S)
    accepted = rng.integers(1, S + 1, size=N).astype(np.int32) if with_accepted else None
    read_col = (accepted - 1) if with_accepted else np.zeros(N, dtype=np.int64)
    if with_accepted:
        accepted[1] = 0  # padding by num_accepted_tokens < 1
    idx[2, read_col[2]] = -1  # padding by a negative read slot
    idx[4, (read_col[4] + 1) % T] = -1  # an active sequence skipping one write
    dtype = np.float32
    pool = _pool(rng, P, dtype, [s for s in idx.ravel() if s >= 0])
    before, out_before = pool.copy(), x["out"].copy()
    _decode(x, pool, idx, backend, num_accepted_tokens=accepted)

    expected_written = {}
    for n in range(N):
        padding = (with_accepted and accepted[n] < 1) or idx[n, read_col[n]] < 0
        if padding:
            assert _bytes_equal(x["out"][n], out_before[n]), f"padding row {n} of out was written"
            continue
        state = before[idx[n, read_col[n]]]
        for t in range(T):
            out_t, state = _fwd_tokens(x, n, slice(t, t + 1), state, dtype)
            assert rel(x["out"][n, t], out_t[0]) <= OUT_LIMIT
            if idx[n, t] >= 0:
                expected_written[int(idx[n, t])] = state
    for s, ref in expected_written.items():
        assert rel(pool[s], ref) <= state_limit(dtype)
    others = [s for s in range(P) if s not in expected_written]
    assert _bytes_equal(pool[others], before[others]), "a slot that is not a write slot was written"
    assert (buf[:, S:] == -99).all()


# ---- errors: the argument is named and nothing is written ----

def _error_problem(rng):
    N, P = 3, 6
    x = make_problem(rng, B=N, T=2, H=H, HV=HV)
    x["state"] = _pool(rng, P, np.float32, range(P))
    x["state_indices"] = np.array([0, 2, 4], dtype=np.int32)
    x["num_accepted_tokens"] = None
    return x


def _spec(x, S=2):
    return {"state_indices": np.arange(3 * S, dtype=np.int32).reshape(3, S)}


ERRORS = [
    ("q-dtype", lambda x: {"q": x["q"].astype(np.float32)}, TypeError, "q"),
    ("state-dtype", lambda x: {"state": x["state"].astype(np.float64)}, TypeError, "state"),
    ("indices-int64", lambda x: {"state_indices": x["state_indices"].astype(np.int64)}, TypeError,
     "state_indices"),
    ("accepted-int64", lambda x: {**_spec(x), "num_accepted_tokens": np.ones(3, np.int64)}, TypeError,
     "num_accepted_tokens"),
    ("state-shape", lambda x: {"state": np.zeros((6, HV, V, 64), np.float32)}, ValueError, "state"),
    ("state-rank", lambda x: {"state": np.zeros((HV, V, K), np.float32)}, ValueError, "state"),
    ("indices-shape", lambda x: {"state_indices": np.zeros(4, np.int32)}, ValueError, "state_indices"),
    ("indices-rank", lambda x: {"state_indices": np.zeros((3, 1, 1), np.int32)}, ValueError,
     "state_indices"),
    ("too-many-slots", lambda x: {"state_indices": np.zeros((3, 9), np.int32)}, ValueError, "state_indices"),
    ("spec-T-over-S", lambda x: {**_with_T(x, 3), **_spec(x)}, ValueError, "state_indices"),
    ("accepted-without-spec", lambda x: {"num_accepted_tokens": np.ones(3, np.int32)}, ValueError,
     "num_accepted_tokens"),
    ("accepted-shape", lambda x: {**_spec(x), "num_accepted_tokens": np.ones(4, np.int32)}, ValueError,
     "num_accepted_tokens"),
    ("slot-out-of-range", lambda x: {"state_indices": np.array([0, 6, 1], np.int32)}, ValueError,
     "state_indices"),
    ("shared-slot", lambda x: {"state_indices": np.array([1, 3, 1], np.int32)}, ValueError, "state_indices"),
    ("accepted-over-S", lambda x: {**_spec(x), "num_accepted_tokens": np.array([1, 3, 1], np.int32)},
     ValueError, "num_accepted_tokens"),
    ("T-over-8", lambda x: _with_T(x, 9), ValueError, "q"),
    ("state-read-only", lambda x: {"state": _read_only(x["state"])}, ValueError, "state"),
    ("state-not-contiguous", lambda x: {"state": x["state"].swapaxes(2, 3)}, ValueError, "state"),
    ("backend-cuda", lambda x: {"backend": "cuda"}, ValueError, "backend"),
]


def _with_T(x, T):
    """The activations of x tiled (and cut) to T tokens, with a matching poisoned out."""
    y = {k: np.ascontiguousarray(np.concatenate([x[k]] * T, 1)[:, :T]) for k in ("q", "k", "v", "g", "beta")}
    y["out"] = poisoned(y["v"].shape, BF16)
    return y


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make,exc,name", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(rng, backend, make, exc, name):
    x = _error_problem(rng)
    x.update(make(x))
    out_before, state_before = x["out"].copy(), x["state"].copy()
    backend = x.pop("backend", backend)
    with pytest.raises(exc) as info:
        flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                         x["dt_bias"], x["lower_bound"], x["state"], x["state_indices"],
                         num_accepted_tokens=x["num_accepted_tokens"], backend=backend)
    assert str(info.value).startswith(name), str(info.value)
    assert _bytes_equal(x["out"], out_before)
    assert _bytes_equal(x["state"], state_before)


# ---- torch tensors ----

def test_torch_matches_numpy(rng):
    torch = pytest.importorskip("torch")
    N, T, P = 4, 3, 6
    x = make_problem(rng, B=N, T=T, H=H, HV=HV)
    idx = np.array([[5, 0, 3, 1], [2, -1, 4, -1], [-1, -1, -1, -1], [1, 1, 1, 1]], np.int32)[:, :T + 1]
    idx[3] = -1
    accepted = np.array([2, 1, 1, 0], np.int32)
    pool = _pool(rng, P, np.float32, range(P))
    t = {k: torch.from_numpy(x[k].view(np.uint16).copy()).view(torch.bfloat16)
         for k in ("q", "k", "v", "g", "beta")}
    t_out = torch.full((N, T, HV, V), float("nan"), dtype=torch.bfloat16)
    t_pool = torch.from_numpy(pool.copy())
    flash_kda.decode(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t_out,
                     torch.from_numpy(x["A_log"]), torch.from_numpy(x["dt_bias"]), x["lower_bound"], t_pool,
                     torch.from_numpy(idx), num_accepted_tokens=torch.from_numpy(accepted))
    _decode(x, pool, idx, "cpu", num_accepted_tokens=accepted)
    assert _bytes_equal(t_out.view(torch.int16).numpy(), x["out"])
    assert _bytes_equal(t_pool.numpy(), pool)

    with pytest.raises(TypeError, match="^state_indices"):
        flash_kda.decode(t["q"], t["k"], t["v"], t["g"], t["beta"], x["scale"], t_out,
                         torch.from_numpy(x["A_log"]), torch.from_numpy(x["dt_bias"]), x["lower_bound"],
                         t_pool, torch.from_numpy(idx).long())
