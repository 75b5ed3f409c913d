"""flash_kda.decode on torch tensors and the custom operator torch.ops.flash_kda.decode: the operator
equals the eager call bit for bit, passes opcheck, propagates shapes and errors on fake tensors, and
a function calling flash_kda.decode compiles with fullgraph=True to the same bits as eager. Tests
marked `cuda` need an sm_90 GPU and a CUDA build (current stream, CUDA graphs, compiled on CUDA)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import flash_kda
from conftest import OUT_LIMIT, make_problem, poisoned, reference_numpy, rel, state_limit
from test_torch_ops import bits, cuda, inputs_late_on_a_side_stream, to_numpy, to_torch, zeroed_inputs

torch = pytest.importorskip("torch")
import flash_kda.torch_ops  # noqa: E402,F401  (needs torch; registers the operators)

H, HV, K, V = 2, 2, 128, 128
needs_cuda = cuda[1]  # skipif: needs torch with CUDA and a CUDA build on an sm_90 GPU


def _pool(rng, P, dtype=np.float32, dim=K):
    return rng.standard_normal((P, HV, dim, dim), dtype=np.float32).astype(dtype)


# (id, builder) -> the NumPy problem plus state, state_indices, num_accepted_tokens; `dim`: K = V
def _plain(rng, dim=K):
    x = make_problem(rng, B=4, T=3, H=H, HV=HV, K=dim, V=dim)
    x.update(state=_pool(rng, 7, dim=dim), state_indices=np.array([5, -1, 0, 3], np.int32),
             num_accepted_tokens=None)
    return x


def _speculative(rng, dim=K):
    x = make_problem(rng, B=3, T=3, H=H, HV=HV, K=dim, V=dim)
    idx = np.array([[0, 1, 2, -1], [3, 4, 5, 6], [7, 8, 9, 10]], np.int32)
    x.update(state=_pool(rng, 12, dim=dim), state_indices=idx,
             num_accepted_tokens=np.array([2, 0, 4], np.int32))  # sequence 1 is padding
    return x


def _varlen(rng):
    x = make_problem(rng, B=1, T=1 + 0 + 8 + 2, H=H, HV=HV, cu_seqlens=[1, 0, 8, 2], cu_dtype=np.int32)
    x.update(state=_pool(rng, 5), state_indices=np.array([2, 4, -1, 0], np.int32), num_accepted_tokens=None)
    return x


def _bf16_pool(rng):
    x = _plain(rng)
    x["state"] = x["state"].astype(x["q"].dtype)
    return x


def _speculative_bf16_d64(rng):
    x = _speculative(rng, dim=64)
    x["state"] = x["state"].astype(x["q"].dtype)
    return x


# K = V = 64: the CUDA kernels' second head dimension.
PROBLEMS = {"plain": _plain, "speculative": _speculative, "varlen": _varlen, "bf16-pool": _bf16_pool,
            "plain-d64": lambda rng: _plain(rng, dim=64), "speculative-bf16-d64": _speculative_bf16_d64}


def _decode(t, **overrides):
    a = {**t, **overrides}
    flash_kda.decode(a["q"], a["k"], a["v"], a["g"], a["beta"], a["scale"], a["out"], a["A_log"],
                     a["dt_bias"], a["lower_bound"], a["state"], a["state_indices"],
                     num_accepted_tokens=a["num_accepted_tokens"], cu_seqlens=a["cu_seqlens"])


def _same(tensor, array):
    """A tensor and a NumPy array hold the same bytes."""
    return torch.equal(bits(tensor), bits(to_torch({"a": array})["a"]))


def _op_args(t):
    return (t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"], t["dt_bias"],
            t["lower_bound"], t["state"], t["state_indices"], t["num_accepted_tokens"], t["cu_seqlens"])


# ---- the operator ----------------------------------------------------------------------------------

def test_operator_is_registered():
    schema = str(torch.ops.flash_kda.decode.default._schema)
    assert re.search(r"Tensor\(\w+!\) out", schema) and re.search(r"Tensor\(\w+!\) state", schema)
    assert "Tensor? num_accepted_tokens=None" in schema and "str? backend=None" in schema


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_operator_matches_decode(rng, problem):
    x = PROBLEMS[problem](rng)
    t = to_torch(x)
    u = to_torch(x)
    _decode(x)  # NumPy
    _decode(t)  # torch, eager
    torch.ops.flash_kda.decode(*_op_args(u))
    for a in (t, u):
        assert _same(a["out"], x["out"]) and _same(a["state"], x["state"])
    padding_rows = {"plain": (1,), "speculative": (1,), "varlen": (0, slice(1, 9)), "bf16-pool": (1,),
                    "plain-d64": (1,), "speculative-bf16-d64": (1,)}
    assert torch.isnan(u["out"][padding_rows[problem]].float()).all()


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch>=2.4")
@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_opcheck(rng, problem):
    t = to_torch(PROBLEMS[problem](rng))
    torch.library.opcheck(torch.ops.flash_kda.decode.default, _op_args(t))
    torch.library.opcheck(torch.ops.flash_kda.decode.default, _op_args(t) + ("reference",))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fake_tensors_give_errors(rng, device):
    """Fake tensors (CUDA ones need no GPU): the fake implementation runs the data-free checks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = _speculative(rng)
    with FakeTensorMode(allow_non_fake_inputs=False):
        t = {n: (torch.empty_like(a, device=device) if isinstance(a, torch.Tensor) else a)
             for n, a in to_torch(x).items()}
        _decode(t)
        torch.ops.flash_kda.decode(*_op_args(t))
        with pytest.raises(TypeError, match=r"^state_indices: dtype must be int32"):
            _decode(t, state_indices=t["state_indices"].long())
        with pytest.raises(TypeError, match=r"^state: dtype must be fp32 or bf16"):
            _decode(t, state=t["state"].half())
        with pytest.raises(ValueError, match=r"^state: expected shape \[P, HV, V, K\]"):
            _decode(t, state=t["state"][:, :1])
        with pytest.raises(ValueError, match=r"^num_accepted_tokens: expected shape"):
            _decode(t, num_accepted_tokens=t["num_accepted_tokens"][:2])
        with pytest.raises(ValueError, match=r"^state_indices: speculative decoding writes one slot"):
            _decode(t, state_indices=t["state_indices"][:, :2], num_accepted_tokens=None)
        with pytest.raises(ValueError, match=r"^state: on device meta"):
            _decode(t, state=torch.empty(t["state"].shape, device="meta"))


def test_fake_cuda_tensors_head_dimensions(rng):
    """Fake CUDA tensors (no GPU needed): the CUDA decode takes K = V = 128 and K = V = 64 (fp32 and
    bf16 pools, speculative rows), and so does the CUDA forward (fixed and packed batches, fp32 and
    bf16 states); other head dimensions are NotImplementedError naming q."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake(x):
        return {n: (torch.empty_like(a, device="cuda") if isinstance(a, torch.Tensor) else a)
                for n, a in to_torch(x).items()}

    decodes = [_plain(rng), _speculative(rng), _plain(rng, 64), _speculative(rng, 64),
               _speculative_bf16_d64(rng)]
    unsupported = [_plain(rng, 32), _speculative(rng, 96)]
    fwds = [make_problem(rng, B=1, T=40, H=H, K=64, V=64, state="fp32"),
            make_problem(rng, B=1, T=300, H=H, K=64, V=64, state="bf16", cu_seqlens=[200, 0, 1, 99]),
            make_problem(rng, B=2, T=40, H=H, K=128, V=128, state="fp32")]
    fwds_unsupported = [make_problem(rng, B=1, T=40, H=H, K=32, V=32, state="fp32"),
                        make_problem(rng, B=1, T=40, H=H, K=96, V=96)]

    def fwd(t):
        flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"],
                      t["dt_bias"], t["lower_bound"], t["initial_state"], t["final_state"],
                      cu_seqlens=t["cu_seqlens"])
    with FakeTensorMode(allow_non_fake_inputs=False):
        for t in map(fake, decodes):
            _decode(t)
            torch.ops.flash_kda.decode(*_op_args(t))
        unsupported_message = r"^q: the CUDA decode supports K = V = 128 or K = V = 64 \(got K="
        for t in map(fake, unsupported):
            with pytest.raises(NotImplementedError, match=unsupported_message):
                _decode(t)
            with pytest.raises(NotImplementedError, match=unsupported_message):
                torch.ops.flash_kda.decode(*_op_args(t))
        for t in map(fake, fwds):
            fwd(t)
        for t in map(fake, fwds_unsupported):
            with pytest.raises(NotImplementedError,
                               match=r"^q: the CUDA forward supports K = V = 128 or K = V = 64 \(got K="):
                fwd(t)


def test_meta_tensors(rng):
    t = {n: (a.to("meta") if isinstance(a, torch.Tensor) else a) for n, a in to_torch(_varlen(rng)).items()}
    torch.ops.flash_kda.decode(*_op_args(t))
    with pytest.raises(ValueError, match=r"^state_indices: expected shape"):
        torch.ops.flash_kda.decode(*_op_args(dict(t, state_indices=t["state_indices"][:2])))


ERRORS = [
    ("indices-int64", lambda t: {"state_indices": t["state_indices"].long()}, TypeError, "state_indices"),
    ("state-fp16", lambda t: {"state": t["state"].half()}, TypeError, "state"),
    ("q-fp32", lambda t: {"q": t["q"].float()}, TypeError, "q"),
    ("slot-out-of-range", lambda t: {"state_indices": torch.tensor([5, -1, 7, 3], dtype=torch.int32)},
     ValueError, "state_indices"),
    ("shared-slot", lambda t: {"state_indices": torch.tensor([5, -1, 3, 3], dtype=torch.int32)}, ValueError,
     "state_indices"),
    ("state-not-contiguous", lambda t: {"state": t["state"].transpose(2, 3)}, ValueError, "state"),
    ("T-over-8", lambda t: {n: t[n].repeat(1, 3, *([1] * (t[n].dim() - 2)))
                            for n in ("q", "k", "v", "g", "beta", "out")}, ValueError, "q"),
    ("state-meta", lambda t: {"state": t["state"].to("meta")}, ValueError, "state"),
]


@pytest.mark.parametrize("route", ["decode", "op"])
@pytest.mark.parametrize("change,error,name", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(rng, route, change, error, name):
    t = to_torch(_plain(rng))
    t.update(change(t))
    on_host = t["state"].device.type == "cpu"  # the state-meta case has no bytes to compare
    before = [bits(t["out"]).clone()] + ([bits(t["state"]).clone()] if on_host else [])
    with pytest.raises(error, match=rf"^{name}: "):
        _decode(t) if route == "decode" else torch.ops.flash_kda.decode(*_op_args(t))
    after = [bits(t["out"])] + ([bits(t["state"])] if on_host else [])
    assert all(torch.equal(a, b) for a, b in zip(after, before))


# ---- torch.compile ----------------------------------------------------------------------------------

def _decode_fn(q, k, v, g, beta, A_log, dt_bias, state, idx, accepted, cu):
    out = torch.zeros_like(v)
    flash_kda.decode(q, k, v, g, beta, q.shape[-1] ** -0.5, out, A_log, dt_bias, -5.0, state, idx,
                     num_accepted_tokens=accepted, cu_seqlens=cu)
    return out * 2, state * 2  # the mutated buffers are used after the call


def _compile_args(x, device="cpu"):
    t = to_torch(x, device)
    return [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state", "state_indices",
                           "num_accepted_tokens", "cu_seqlens")]


# inductor (the default backend) compiles C++ on the host: two problems; aot_eager: all of them.
@pytest.mark.parametrize("problem,backend", [(p, "aot_eager") for p in PROBLEMS]
                         + [("plain", "inductor"), ("speculative", "inductor")])
def test_compile_fullgraph_matches_eager(rng, problem, backend):
    torch._dynamo.reset()
    x = PROBLEMS[problem](rng)
    args = _compile_args(x)
    eager_args = [a if a is None else a.clone() for a in args]
    compiled = torch.compile(_decode_fn, fullgraph=True, backend=backend)
    with torch.inference_mode():
        got = compiled(*args)
        want = _decode_fn(*eager_args)
        again = compiled(*args)  # a second call on the updated pool: no recompilation needed
        want_again = _decode_fn(*eager_args)
    for a, b in zip(got + again, want + want_again):
        assert torch.equal(bits(a), bits(b))
    assert torch.equal(bits(args[7]), bits(eager_args[7]))  # the pool, updated in place in both


def test_compile_then_decode_steps_match_the_reference(rng):
    """Three compiled decode steps of one token each on a pool equal one fwd over the three tokens."""
    torch._dynamo.reset()
    x = make_problem(rng, B=3, T=3, H=H, HV=HV)
    pool = _pool(rng, 4)
    idx = np.array([2, 0, 3], np.int32)
    t = to_torch(x)
    state = torch.from_numpy(pool.copy())
    compiled = torch.compile(_decode_fn, fullgraph=True)
    outs = []
    with torch.inference_mode():
        for step in range(3):
            tok = {n: t[n][:, step:step + 1].contiguous() for n in ("q", "k", "v", "g", "beta")}
            out, _ = compiled(tok["q"], tok["k"], tok["v"], tok["g"], tok["beta"], t["A_log"], t["dt_bias"],
                              state, torch.from_numpy(idx), None, None)
            outs.append(out / 2)
    out64, state64 = reference_numpy(dict(x, initial_state=pool[idx]))
    assert rel(to_numpy(torch.cat(outs, 1)), out64) <= OUT_LIMIT
    assert rel(state.numpy()[idx], state64) <= state_limit(np.float32)
    assert torch.equal(bits(state[1]), bits(torch.from_numpy(pool[1])))


def test_compile_reports_bad_arguments_at_trace_time(rng):
    torch._dynamo.reset()
    args = _compile_args(_plain(rng))
    args[8] = args[8].long()
    with pytest.raises(Exception, match=r"state_indices: dtype must be int32"):
        torch.compile(_decode_fn, fullgraph=True, backend="aot_eager")(*args)


def test_torch_imported_after_flash_kda_still_compiles():
    """flash_kda imported first, then torch: the first decode call, inside the compiled function,
    loads flash_kda.torch_ops and becomes the operator (no graph break with fullgraph=True)."""
    code = (
        "import sys, flash_kda\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "N, H, K = 3, 2, 128\n"
        "r = lambda *s: torch.randn(*s).bfloat16()\n"
        "q, k, v, g = (r(N, 1, H, K) for _ in range(4)); beta = r(N, 1, H)\n"
        "A, dt = torch.rand(H), torch.rand(H, K)\n"
        "pool = torch.randn(5, H, K, K); idx = torch.tensor([4, -1, 0], dtype=torch.int32)\n"
        "def f(q, k, v, g, beta, A, dt, state, idx):\n"
        "    out = torch.zeros_like(v)\n"
        "    flash_kda.decode(q, k, v, g, beta, K ** -0.5, out, A, dt, -5.0, state, idx)\n"
        "    return out\n"
        "p1, p2 = pool.clone(), pool.clone()\n"
        "o = torch.compile(f, fullgraph=True, backend='aot_eager')(q, k, v, g, beta, A, dt, p1, idx)\n"
        "assert torch.equal(o, f(q, k, v, g, beta, A, dt, p2, idx)) and torch.equal(p1, p2)\n"
        "assert hasattr(torch.ops.flash_kda, 'decode')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- CUDA -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("problem", list(PROBLEMS))
@pytest.mark.parametrize("route", ["decode", "op"])
@pytest.mark.cuda
@needs_cuda
def test_cuda_matches_cpu(rng, problem, route):
    """The CUDA kernel against the CPU backend (SPEC tolerances; padding rows and other slots kept)."""
    x = PROBLEMS[problem](rng)
    t = to_torch(x, "cuda")
    _decode(x)
    _decode(t) if route == "decode" else torch.ops.flash_kda.decode(*_op_args(t))
    torch.cuda.synchronize()
    out, pool = to_numpy(t["out"]), to_numpy(t["state"])
    written = np.isfinite(x["out"].astype(np.float32))
    assert (np.isfinite(out.astype(np.float32)) == written).all()
    assert rel(out[written], x["out"][written].astype(np.float32)) <= OUT_LIMIT
    assert rel(pool, x["state"]) <= state_limit(x["state"].dtype)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("route", ["decode", "op", "compiled"])
def test_cuda_runs_on_the_current_stream(rng, route):
    """The inputs become valid on a side stream only after a long sleep kernel; a call on that
    stream must see them (a launch on another stream would read the zeros written before)."""
    torch._dynamo.reset()
    x = _plain(rng)
    t = to_torch(x, "cuda")
    real = zeroed_inputs(t)
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state", "state_indices", "num_accepted_tokens",
             "cu_seqlens")
    compiled = None
    if route == "compiled":  # compiled and run once beforehand, on copies
        compiled = torch.compile(_decode_fn, fullgraph=True)
        with torch.inference_mode():
            compiled(*[t[n] if t[n] is None else t[n].clone() for n in names])
    with inputs_late_on_a_side_stream(t, real):
        if route == "decode":
            _decode(t)
            out = t["out"]
        elif route == "op":
            torch.ops.flash_kda.decode(*_op_args(t))
            out = t["out"]
        else:
            out, _ = compiled(*[t[n] for n in names])
            out = out / 2
    _decode(x)
    rows = [0, 2, 3]
    assert rel(to_numpy(out)[rows], x["out"][rows].astype(np.float32)) <= OUT_LIMIT


@pytest.mark.cuda
@needs_cuda
def test_cuda_graph_capture_and_compile_reduce_overhead(rng):
    """flash_kda.decode and the operator captured in a CUDA graph, replayed after the slots change;
    and torch.compile(mode="reduce-overhead") against eager."""
    x = _plain(rng)
    t = to_torch(x, "cuda")
    u = to_torch(x, "cuda")
    pool0 = t["state"].clone()
    for _ in range(2):  # warm-up
        _decode(t)
        torch.ops.flash_kda.decode(*_op_args(u))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _decode(t)
        torch.ops.flash_kda.decode(*_op_args(u))
    new_idx = torch.tensor([1, 6, -1, 2], dtype=torch.int32)
    for a in (t, u):
        a["state"].copy_(pool0)
        a["state_indices"].copy_(new_idx)
        a["out"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    y = dict(x, state=pool0.cpu().numpy(), state_indices=new_idx.numpy(),
             out=poisoned(x["out"].shape, x["out"].dtype))
    _decode(y)
    for a in (t, u):
        out = to_numpy(a["out"]).astype(np.float32)
        assert np.isnan(out[2]).all()
        assert rel(out[[0, 1, 3]], y["out"][[0, 1, 3]].astype(np.float32)) <= OUT_LIMIT
        assert rel(to_numpy(a["state"]), y["state"]) <= state_limit(np.float32)

    torch._dynamo.reset()
    compiled = torch.compile(_decode_fn, fullgraph=True, mode="reduce-overhead")
    args = _compile_args(x, "cuda")
    eager_args = [a if a is None else a.clone() for a in args]
    with torch.inference_mode():
        for _ in range(3):  # warm-up, record, replay
            got = [a.clone() for a in compiled(*args)]
            want = _decode_fn(*eager_args)
            assert torch.equal(bits(got[0]), bits(want[0]))
    assert torch.equal(bits(args[7]), bits(eager_args[7]))


def test_reference_backend_through_the_operator(rng):
    """backend="reference" reaches the float64 recurrence through the operator too."""
    x = _plain(rng)
    t = to_torch(x)
    torch.ops.flash_kda.decode(*_op_args(t), backend="reference")
    flash_kda.decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["out"], x["A_log"],
                     x["dt_bias"], x["lower_bound"], x["state"], x["state_indices"], backend="reference")
    assert _same(t["out"], x["out"]) and _same(t["state"], x["state"])
