"""The PyTorch layer: chunk_kda, the custom operators torch.ops.flash_kda.{fwd, chunk_kda}, their
fake implementations, torch.compile, the direct eager route of fwd and its errors, fla's dispatch.

CPU tests run wherever torch is installed; tests marked `cuda` need an sm_90 GPU and a CUDA build
(CUDA graphs, streams, torch.compile on CUDA). fla's own GPU checks are in tests/gpu/.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys

import numpy as np
import pytest

import flash_kda
from conftest import (BF16, OUT_LIMIT, call, make_problem, reference_numpy, rel, require_in_ci,
                      state_limit)
from test_errors import ERRORS, _valid_problem

torch = pytest.importorskip("torch")
import flash_kda.torch_ops  # noqa: E402,F401  (needs torch; registers the operators)

CUDA = torch.cuda.is_available() and flash_kda.cuda_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(
    not CUDA, reason="needs torch with CUDA and a CUDA build of flash-kda on an sm_90 GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def to_torch(x, device="cpu", copy=True):
    """The NumPy problem `x` (make_problem) as torch tensors with the same bits: copies (an in-place
    state update must not change the NumPy problem the reference reads; an array given twice, e.g.
    a pool as both initial_state and final_state, stays one tensor), or with copy=False on the
    host, views of the same memory with the same strides."""
    converted = {}

    def convert(a):
        if not isinstance(a, np.ndarray):
            return a
        if id(a) not in converted:
            t = torch.from_numpy(a.view(np.int16) if a.dtype == BF16 else a)
            t = t.view(torch.bfloat16) if a.dtype == BF16 else t
            converted[id(a)] = t.to(device, copy=copy)
        return converted[id(a)]
    return {n: convert(a) for n, a in x.items()}


FWD_ARGS = ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias", "lower_bound",
            "initial_state", "final_state", "cu_seqlens")


def fwd(t, cu_seqlens_cpu=None, **overrides):
    """flash_kda.fwd on the torch problem `t`, positionally, with cu_seqlens_cpu."""
    a = {**t, **overrides}
    return flash_kda.fwd(*(a[n] for n in FWD_ARGS), cu_seqlens_cpu=cu_seqlens_cpu)


def to_numpy(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(BF16)
    return t.numpy()


def bits(t):
    """The bytes of a tensor, for bit-for-bit comparisons."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def zeroed_inputs(t, names=("q", "k", "v", "g")):
    """Zeroes those tensors of the problem `t` and returns copies of their values."""
    real = {n: t[n].clone() for n in names}
    for n in real:
        t[n].zero_()
    return real


@contextlib.contextmanager
def inputs_late_on_a_side_stream(t, real):
    """Runs the body on a new CUDA stream (in inference mode) right after that stream sleeps ~0.1 s
    and then copies `real` back into t's zeroed tensors: a launch on any other stream would read
    the zeros. Synchronises the stream at the end."""
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.inference_mode():
        torch.cuda._sleep(200_000_000)  # ~0.1 s
        for n, a in real.items():
            t[n].copy_(a)
        yield
    stream.synchronize()


def chunk(t, **overrides):
    """flash_kda.chunk_kda on the torch problem `t` with fla-style keywords."""
    kw = dict(scale=t["scale"], initial_state=t["initial_state"],
              output_final_state=t["final_state"] is not None, lower_bound=t["lower_bound"],
              cu_seqlens=t["cu_seqlens"], A_log=t["A_log"], dt_bias=t["dt_bias"])
    kw.update(overrides)
    q, k, v, g, beta = (kw.pop(n, t[n]) for n in ("q", "k", "v", "g", "beta"))
    return flash_kda.chunk_kda(q, k, v, g, beta, **kw)


def check_against_reference(x, out, final_state):
    out64, state64 = reference_numpy(x)
    o = to_numpy(out).astype(np.float32)
    assert np.isfinite(o).all()
    assert rel(o, out64) <= OUT_LIMIT
    if final_state is not None:
        s = to_numpy(final_state).astype(np.float32)
        assert np.isfinite(s).all()
        assert rel(s, state64) <= state_limit(x["initial_state"].dtype
                                              if x["initial_state"] is not None else np.float32)


# ---- chunk_kda ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state", [None, "fp32", "bf16"])
@pytest.mark.parametrize("lens", [None, [37, 0, 100, 1]])
def test_chunk_kda_matches_reference(rng, device, state, lens):
    if lens is None:
        x = make_problem(rng, B=2, T=70, H=2, state=state)
    else:
        x = make_problem(rng, B=1, T=sum(lens), H=2, state=state, cu_seqlens=lens)
    t = to_torch(x, device)
    with torch.inference_mode():
        o, final = chunk(t, output_final_state=True)
    assert o.shape == t["v"].shape and o.dtype == torch.bfloat16 and o.device == t["q"].device
    N = 2 if lens is None else len(lens)
    assert final.shape == (N, 2, 128, 128) and final.device == t["q"].device
    assert final.dtype == (torch.bfloat16 if state == "bf16" else torch.float32)
    check_against_reference(x, o, final)


def test_chunk_kda_gva_and_flat_dt_bias(rng):
    x = make_problem(rng, B=1, T=50, H=1, HV=2, state="fp32", flat_dt_bias=True)
    t = to_torch(x)
    with torch.no_grad():
        o, final = chunk(t)
    check_against_reference(x, o, final)


@pytest.mark.parametrize("device", DEVICES)
def test_chunk_kda_equals_fwd_bit_for_bit(rng, device):
    x = make_problem(rng, B=1, T=90, H=2, state="fp32", cu_seqlens=[60, 30])
    t = to_torch(x, device)
    call(t)
    with torch.inference_mode():
        o, final = chunk(t)
    assert torch.equal(bits(o), bits(t["out"]))
    assert torch.equal(bits(final), bits(t["final_state"]))


def test_chunk_kda_defaults_and_equivalent_options(rng):
    x = make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[25, 15])
    t = to_torch(x)
    H, K = 2, 128
    with torch.inference_mode():
        o, final = chunk(t)
        # scale=None is K ** -0.5 (make_problem's value)
        o2, _ = chunk(t, scale=None)
        assert torch.equal(bits(o2), bits(o))
        # A_log=None: rate 1 (exp(0)); dt_bias=None: no bias
        o3, _ = chunk(t, A_log=None, dt_bias=None)
        o4, _ = chunk(t, A_log=torch.zeros(H), dt_bias=torch.zeros(H * K))
        assert torch.equal(bits(o3), bits(o4))
        # int32 cu_seqlens, chunk_size 32, disable_recompute and use_graph change nothing
        o5, f5 = chunk(t, cu_seqlens=t["cu_seqlens"].int(), chunk_size=32, disable_recompute=True,
                       use_graph=True, max_num_seqs=2)
        assert torch.equal(bits(o5), bits(o)) and torch.equal(bits(f5), bits(final))
        # no final state unless asked
        o6, f6 = chunk(t, output_final_state=False)
        assert f6 is None and torch.equal(bits(o6), bits(o))


def test_chunk_kda_k_first_state_layout(rng):
    """state_v_first=False takes and returns fla's default [N, HV, K, V] layout."""
    x = make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[25, 15])
    t = to_torch(x)
    with torch.inference_mode():
        o, final = chunk(t)
        k_first = t["initial_state"].transpose(2, 3).contiguous()
        o2, final2 = chunk(t, initial_state=k_first, state_v_first=False)
        o3, final3 = chunk(t, initial_state=k_first, transpose_state_layout=False)
    assert torch.equal(bits(o2), bits(o)) and torch.equal(bits(o3), bits(o))
    assert final2.is_contiguous() and torch.equal(final2, final.transpose(2, 3))
    assert torch.equal(final3, final2)


UNSUPPORTED = [
    ("use_qk_l2norm_in_kernel", dict(use_qk_l2norm_in_kernel=False)),
    ("use_gate_in_kernel", dict(use_gate_in_kernel=False)),
    ("use_beta_sigmoid_in_kernel", dict(use_beta_sigmoid_in_kernel=False)),
    ("return_intermediate_states", dict(return_intermediate_states=True)),
    ("cp_context", dict(cp_context=object())),
]


@pytest.mark.parametrize("name,kw", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_chunk_kda_unsupported_options_raise(rng, name, kw):
    t = to_torch(make_problem(rng, B=1, T=8, H=1))
    with torch.inference_mode(), pytest.raises(NotImplementedError, match=rf"^{name}: "):
        chunk(t, **kw)


def test_chunk_kda_safe_gate_needs_a_lower_bound(rng):
    """fla's safe gate is the bounded one: safe_gate=True without a lower_bound is an error (the
    softplus gate of lower_bound=None is asked for with safe_gate=False, fla's default)."""
    t = to_torch(make_problem(rng, B=1, T=8, H=1))
    with torch.inference_mode(), pytest.raises(ValueError, match=r"^safe_gate: "):
        chunk(t, safe_gate=True, lower_bound=None)


BAD_CHUNK_CALLS = [
    ("q-fp16", lambda t: dict(q=t["q"].half()), TypeError, "q"),
    ("q-int16", lambda t: dict(q=t["q"].view(torch.int16)), TypeError, "q"),
    ("q-numpy", lambda t: dict(q=t["q"].float().numpy()), TypeError, "q"),
    ("q-rank3", lambda t: dict(q=t["q"][0]), ValueError, "q"),
    ("v-rank3", lambda t: dict(v=t["v"][0]), ValueError, "v"),
    ("beta-shape", lambda t: dict(beta=t["beta"][:, :-1]), ValueError, "beta"),
    ("A_log-fp64", lambda t: dict(A_log=t["A_log"].double()), TypeError, "A_log"),
    ("initial_state-shape", lambda t: dict(initial_state=t["initial_state"][:1]), ValueError,
     "initial_state"),
    ("initial_state-fp16", lambda t: dict(initial_state=t["initial_state"].half()), TypeError,
     "initial_state"),
    ("lower_bound-range", lambda t: dict(lower_bound=-6.0), ValueError, "lower_bound"),
    ("lower_bound-str", lambda t: dict(lower_bound="-5"), TypeError, "lower_bound"),
    ("scale-str", lambda t: dict(scale="0.1"), TypeError, "scale"),
    ("cu_seqlens-end", lambda t: dict(cu_seqlens=torch.tensor([0, 10, 20])), ValueError,
     "cu_seqlens"),
    ("cu_seqlens_cpu-shape", lambda t: dict(cu_seqlens_cpu=torch.tensor([0, 40])), ValueError,
     "cu_seqlens_cpu"),
    ("chunk_size", lambda t: dict(chunk_size=48), ValueError, "chunk_size"),
    ("max_num_seqs", lambda t: dict(use_graph=True, max_num_seqs=3), ValueError, "max_num_seqs"),
]


@pytest.mark.parametrize("change,error,name", [b[1:] for b in BAD_CHUNK_CALLS],
                         ids=[b[0] for b in BAD_CHUNK_CALLS])
def test_chunk_kda_errors_name_the_argument(rng, change, error, name):
    t = to_torch(make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[25, 15]))
    before = bits(t["initial_state"]).clone()
    with torch.inference_mode(), pytest.raises(error, match=rf"^{name}: "):
        chunk(t, **change(t))
    assert torch.equal(bits(t["initial_state"]), before)


def test_chunk_kda_refuses_to_drop_gradients(rng):
    t = to_torch(make_problem(rng, B=1, T=8, H=1))
    t["A_log"].requires_grad_(True)
    with pytest.raises(NotImplementedError, match=r"^chunk_kda: an input requires grad"):
        chunk(t)
    with torch.no_grad():
        o, _ = chunk(t)
    with torch.inference_mode():
        o2, _ = chunk(t)
    assert not o.requires_grad and torch.equal(bits(o), bits(o2))


# ---- fwd on torch tensors: the direct route gives the checked route's errors ---------------------

def _torch_error_cases():
    skip = {"q-negative-stride", "out-read-only", "final_state-read-only"}  # no torch equivalent
    return [e for e in ERRORS if e[0] not in skip]


@pytest.mark.parametrize("change,error,name", [e[1:] for e in _torch_error_cases()],
                         ids=[e[0] for e in _torch_error_cases()])
def test_fwd_torch_errors_match_numpy(rng, change, error, name):
    x = _valid_problem(rng)
    x.update(change(x))
    t = to_torch(x, copy=False)
    outputs = [a for a in (t["out"], t["final_state"], t["initial_state"]) if isinstance(a, torch.Tensor)]
    for a in outputs:
        a.fill_(3.0)
    before = [bits(a).clone() for a in outputs]
    with pytest.raises(error, match=rf"^{name}: "):
        call(t)
    for a, b in zip(outputs, before):
        assert torch.equal(bits(a), b)


def test_fwd_int16_tensor_is_not_bf16(rng):
    """DLPack lets NumPy pass bf16 as 16-bit integers; a torch int16 tensor must still be refused."""
    t = to_torch(make_problem(rng, B=1, T=8, H=1))
    for name in ("q", "out"):
        with pytest.raises(TypeError, match=rf"^{name}: dtype must be bf16 \(got int16\)"):
            call(t, **{name: t[name].view(torch.int16)})
    assert torch.isnan(t["out"].float()).all()


def test_fwd_cu_seqlens_cpu(rng):
    x = make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[25, 15])
    t = to_torch(x)
    call(t)
    expected = bits(t["out"]).clone()
    t["out"].fill_(float("nan"))
    fwd(t, cu_seqlens_cpu=t["cu_seqlens"].clone())
    assert torch.equal(bits(t["out"]), expected)
    with pytest.raises(ValueError, match=r"^cu_seqlens_cpu: expected shape"):
        fwd(t, cu_seqlens_cpu=torch.tensor([0, 40]))
    with pytest.raises(ValueError, match=r"^cu_seqlens_cpu: given without cu_seqlens"):
        fwd(t, cu_seqlens=None, initial_state=None, final_state=None,
            cu_seqlens_cpu=torch.tensor([0, 40]))
    with pytest.raises(TypeError, match=r"^cu_seqlens_cpu: dtype must be int64 or int32"):
        fwd(t, cu_seqlens_cpu=t["cu_seqlens"].float())


# ---- the custom operators -------------------------------------------------------------------------

def _op_fwd_args(t):
    return tuple(t[n] for n in ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias",
                                "lower_bound", "initial_state", "final_state", "cu_seqlens"))


def _op_chunk_args(t, output_final_state=True):
    return (t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["A_log"], t["dt_bias"],
            t["lower_bound"], t["initial_state"], t["cu_seqlens"], None, output_final_state)


def test_operators_are_registered():
    assert hasattr(torch.ops.flash_kda, "fwd") and hasattr(torch.ops.flash_kda, "chunk_kda")
    schema = str(torch.ops.flash_kda.fwd.default._schema)
    assert re.search(r"Tensor\(a\w*!\) out", schema) and re.search(r"Tensor\(a\w*!\)\? final_state", schema)


def test_fwd_operator_matches_fwd(rng):
    x = make_problem(rng, B=1, T=60, H=2, state="fp32", cu_seqlens=[20, 0, 40])
    t = to_torch(x)
    call(t)
    expected_out, expected_state = bits(t["out"]).clone(), bits(t["final_state"]).clone()
    t["out"].fill_(float("nan"))
    t["final_state"].fill_(float("nan"))
    torch.ops.flash_kda.fwd(*_op_fwd_args(t))
    assert torch.equal(bits(t["out"]), expected_out)
    assert torch.equal(bits(t["final_state"]), expected_state)
    # in place: final_state is initial_state
    state = t["initial_state"].clone()
    torch.ops.flash_kda.fwd(*_op_fwd_args(dict(t, initial_state=state, final_state=state)))
    assert torch.equal(bits(state), expected_state)


def test_chunk_kda_operator(rng):
    x = make_problem(rng, B=1, T=60, H=2, state="bf16", cu_seqlens=[20, 0, 40])
    t = to_torch(x)
    o, final = torch.ops.flash_kda.chunk_kda(*_op_chunk_args(t))
    check_against_reference(x, o, final)
    o2, placeholder = torch.ops.flash_kda.chunk_kda(*_op_chunk_args(t, False))
    assert placeholder.shape == (0,) and torch.equal(bits(o2), bits(o))


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch>=2.4")
def test_opcheck(rng):
    x = make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[25, 15])
    t = to_torch(x)
    torch.library.opcheck(torch.ops.flash_kda.fwd.default, _op_fwd_args(t))
    torch.library.opcheck(torch.ops.flash_kda.chunk_kda.default, _op_chunk_args(t))
    torch.library.opcheck(torch.ops.flash_kda.chunk_kda.default, _op_chunk_args(t, False))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fake_tensors_give_shapes_and_errors(rng, device):
    """Fake CUDA tensors need no GPU: the fake implementations run the data-free checks."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    x = make_problem(rng, B=1, T=40, H=2, state="bf16", cu_seqlens=[25, 15])
    with FakeTensorMode(allow_non_fake_inputs=False):
        t = {n: (torch.empty_like(a, device=device) if isinstance(a, torch.Tensor) else a)
             for n, a in to_torch(x).items()}
        o, final = chunk(t)
        assert isinstance(o, FakeTensor) and isinstance(final, FakeTensor)
        assert o.shape == (1, 40, 2, 128) and o.dtype == torch.bfloat16
        assert final.shape == (2, 2, 128, 128) and final.dtype == torch.bfloat16
        assert o.device.type == device and final.device.type == device
        call(t)  # fwd: the mutating operator
        with pytest.raises(TypeError, match=r"^q: dtype must be bf16"):
            chunk(t, q=t["q"].float())
        with pytest.raises(ValueError, match=r"^initial_state: expected shape"):
            chunk(t, initial_state=t["initial_state"][:1])
        with pytest.raises(ValueError, match=r"^k: on device"):
            call(t, k=torch.empty_like(t["k"], device="meta"))


def test_meta_tensors(rng):
    t = {n: (a.to("meta") if isinstance(a, torch.Tensor) else a)
         for n, a in to_torch(make_problem(rng, B=1, T=40, H=2, state="fp32", cu_seqlens=[25, 15])).items()}
    o, final = torch.ops.flash_kda.chunk_kda(*_op_chunk_args(t))
    assert o.device.type == "meta" and o.shape == (1, 40, 2, 128) and final.shape == (2, 2, 128, 128)


# ---- torch.compile ------------------------------------------------------------------------------------

def _chunk_fn(q, k, v, g, beta, A_log, dt_bias, h0, cu):
    return flash_kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               lower_bound=-5.0, cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias)


def _fwd_fn(q, k, v, g, beta, A_log, dt_bias, h0, cu):
    out = torch.empty_like(v)
    final = torch.empty_like(h0)
    flash_kda.fwd(q, k, v, g, beta, q.shape[-1] ** -0.5, out, A_log, dt_bias, -5.0, h0, final, cu)
    return out * 2, final  # the mutated buffers are used after the call


def _fwd_in_place_fn(q, k, v, g, beta, A_log, dt_bias, state, cu):
    out = torch.empty_like(v)
    flash_kda.fwd(q, k, v, g, beta, q.shape[-1] ** -0.5, out, A_log, dt_bias, -5.0, state, state, cu)
    return out


def _compile_inputs(rng, device, T=70, lens=(30, 0, 40)):
    x = make_problem(rng, B=1, T=T, H=2, state="fp32", cu_seqlens=list(lens))
    t = to_torch(x, device)
    return x, [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                              "cu_seqlens")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", [_chunk_fn, _fwd_fn, _fwd_in_place_fn],
                         ids=["chunk_kda", "fwd", "fwd_in_place"])
def test_compile_fullgraph_matches_eager(rng, device, fn):
    torch._dynamo.reset()
    x, args = _compile_inputs(rng, device)
    eager_args = [a.clone() for a in args]
    compiled = torch.compile(fn, fullgraph=True)
    with torch.inference_mode():
        got = compiled(*args)
        want = fn(*eager_args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for a, b in zip(got, want):
        assert torch.equal(bits(a), bits(b))
    if fn is _fwd_in_place_fn:  # the state was updated in place in both
        assert torch.equal(bits(args[7]), bits(eager_args[7]))
    check_against_reference(x, want[0] / 2 if fn is _fwd_fn else want[0], None)


def test_compile_dynamic_shapes(rng):
    torch._dynamo.reset()
    compiled = torch.compile(_chunk_fn, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.inference_mode():
        for T in (41, 77):
            _, args = _compile_inputs(rng, "cpu", T=T, lens=(T - 20, 20))
            got, want = compiled(*args), _chunk_fn(*args)
            assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))


def test_compile_reports_bad_arguments_at_trace_time(rng):
    torch._dynamo.reset()
    _, args = _compile_inputs(rng, "cpu")
    args[0] = args[0].float()
    with pytest.raises(Exception, match=r"q: dtype must be bf16"):
        torch.compile(_chunk_fn, fullgraph=True, backend="aot_eager")(*args)


# ---- loading: torch only when used; operators registered by first use ------------------------------------

def _run(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_torch_imported_after_flash_kda_still_compiles():
    """flash_kda imported first, then torch: the operators get registered while torch.compile
    traces the first call (no graph break with fullgraph=True)."""
    _run(
        "import sys, flash_kda\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "B, T, H, K = 1, 20, 2, 128\n"
        "r = lambda *s: torch.randn(*s).bfloat16()\n"
        "q, k, v, g = (r(B, T, H, K) for _ in range(4)); beta = r(B, T, H)\n"
        "A, dt = torch.rand(H), torch.rand(H, K)\n"
        "def f(q, k, v, g, beta, A, dt):\n"
        "    out = torch.empty_like(v)\n"
        "    flash_kda.fwd(q, k, v, g, beta, K ** -0.5, out, A, dt, -5.0)\n"
        "    return out\n"
        "o = torch.compile(f, fullgraph=True, backend='aot_eager')(q, k, v, g, beta, A, dt)\n"
        "assert torch.equal(o, f(q, k, v, g, beta, A, dt))\n"
    )


def test_without_torch():
    """torch blocked: the package imports, `import *` works, chunk_kda is simply absent."""
    _run(
        "import sys\n"
        "sys.modules['torch'] = None  # import torch now fails\n"
        "import flash_kda\n"
        "from flash_kda import *\n"
        "assert not hasattr(flash_kda, 'chunk_kda')\n"
        "try:\n"
        "    flash_kda.chunk_kda\n"
        "except AttributeError as e:\n"
        "    assert 'needs PyTorch' in str(e)\n"
        "try:\n"
        "    flash_kda.fwd([1], None, None, None, None, 0.1, None, None, None, -1.0)\n"
        "except TypeError as e:\n"
        "    assert str(e).startswith('q: expected a NumPy array')\n"
    )


def test_chunk_kda_attribute_loads_torch():
    out = _run(
        "import sys, flash_kda\n"
        "assert 'torch' not in sys.modules\n"
        "f = flash_kda.chunk_kda\n"
        "import torch\n"
        "print(f is flash_kda.torch_ops.chunk_kda, hasattr(torch.ops.flash_kda, 'chunk_kda'))\n"
    )
    assert out.split() == ["True", "True"]


# ---- fla's dispatch (fla importable; on the host, its FlashKDA backend runs our CPU backend) ----------

def _fla():
    try:
        from fla.ops.kda import chunk_kda
    except Exception:  # not installed, or not importable here
        return None
    return chunk_kda


@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_fla_dispatches_to_flash_kda_on_cpu(rng, monkeypatch, state):
    """fla allocates an fp32 final state whatever the initial state's dtype (a bf16 initial state
    with an fp32 final state, the case that used to fail with "dtype must match initial_state")."""
    fla_chunk_kda = _fla()
    if fla_chunk_kda is None:
        require_in_ci("fla")
        pytest.skip("fla (flash-linear-attention) is not importable")
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    calls = []
    real = flash_kda.fwd
    monkeypatch.setattr(flash_kda, "fwd", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    x = make_problem(rng, B=1, T=140, H=2, state=state, cu_seqlens=[100, 0, 39, 1])
    t = to_torch(x)
    with torch.inference_mode():
        o, final = fla_chunk_kda(
            q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], scale=t["scale"],
            initial_state=t["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
            lower_bound=-5.0, state_v_first=True, cu_seqlens=t["cu_seqlens"], A_log=t["A_log"],
            dt_bias=t["dt_bias"].flatten())
    assert len(calls) == 1
    assert final.dtype == torch.float32
    out64, state64 = reference_numpy(x)
    assert rel(to_numpy(o), out64) <= OUT_LIMIT
    assert rel(to_numpy(final), state64) <= state_limit(np.float32)


# ---- CUDA ------------------------------------------------------------------------------------------------

def _cuda_problem(rng, state="fp32", lens=(300, 17, 700, 1), H=4):
    x = make_problem(rng, B=1, T=sum(lens), H=H, state=state, cu_seqlens=list(lens))
    return x, to_torch(x, "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs an sm_90 GPU")
def test_cuda_graph_capture_and_replay(rng):
    """fwd, the fwd operator and chunk_kda captured in one CUDA graph; replayed after the inputs and
    the cu_seqlens contents change in place."""
    x, t = _cuda_problem(rng)
    args = _op_fwd_args(t)
    out2, final2 = torch.empty_like(t["out"]), torch.empty_like(t["final_state"])
    args2 = args[:6] + (out2,) + args[7:11] + (final2, args[12])
    for _ in range(2):  # warm-up before capturing
        flash_kda.fwd(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        flash_kda.fwd(*args)
        torch.ops.flash_kda.fwd(*args2)
        o3, final3 = chunk(t)
    # new inputs and a new split of the same tokens, written into the captured buffers
    y = make_problem(rng, B=1, T=1018, H=4, state="fp32", cu_seqlens=[1, 500, 0, 517])
    u = to_torch(y, "cuda")
    with torch.inference_mode():  # o3 and final3 are inference tensors
        for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
            t[n].copy_(u[n])
        for buffer in (t["out"], out2, o3, t["final_state"], final2, final3):
            buffer.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    for out, final in ((t["out"], t["final_state"]), (out2, final2), (o3, final3)):
        check_against_reference(y, out, final)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("route", ["fwd", "op", "chunk_kda"])
def test_cuda_runs_on_the_current_stream(rng, route):
    """The inputs become valid on a side stream only after a long sleep kernel; a call on that
    stream must see them (a launch on another stream would read the zeros written before)."""
    x, t = _cuda_problem(rng, lens=(200, 56))
    real = zeroed_inputs(t)
    with inputs_late_on_a_side_stream(t, real):
        if route == "fwd":
            fwd(t, cu_seqlens_cpu=t["cu_seqlens"].cpu())
            out, final = t["out"], t["final_state"]
        elif route == "op":
            torch.ops.flash_kda.fwd(*_op_fwd_args(t))
            out, final = t["out"], t["final_state"]
        else:
            out, final = chunk(t, cu_seqlens_cpu=t["cu_seqlens"].cpu())
    check_against_reference(x, out, final)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs an sm_90 GPU")
def test_cuda_no_synchronisation_with_cu_seqlens_cpu(rng):
    x, t = _cuda_problem(rng)
    cu_cpu = t["cu_seqlens"].cpu()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fwd(t, cu_seqlens_cpu=cu_cpu)
        with torch.inference_mode():
            o, final = chunk(t, cu_seqlens_cpu=cu_cpu)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    check_against_reference(x, t["out"], t["final_state"])
    check_against_reference(x, o, final)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs an sm_90 GPU")
def test_cuda_bad_cu_seqlens_cpu_is_caught(rng):
    _, t = _cuda_problem(rng)
    with pytest.raises(ValueError, match=r"^cu_seqlens: must end at"):
        fwd(t, cu_seqlens_cpu=torch.tensor([0, 300, 317, 1017, 1017]))
    with pytest.raises(ValueError, match=r"^cu_seqlens_cpu: must be in host memory"):
        fwd(t, cu_seqlens_cpu=t["cu_seqlens"])
    assert torch.isnan(t["out"].float()).all()


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs an sm_90 GPU")
def test_cuda_compile_reduce_overhead(rng):
    """torch.compile with CUDA graphs (mode="reduce-overhead") against eager."""
    torch._dynamo.reset()
    x, args = _compile_inputs(rng, "cuda", T=1018, lens=(300, 17, 700, 1))
    compiled = torch.compile(_chunk_fn, fullgraph=True, mode="reduce-overhead")
    with torch.inference_mode():
        want = _chunk_fn(*args)
        for _ in range(3):  # warm-up, record, replay
            got = compiled(*args)
        got = [a.clone() for a in got]
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))
    check_against_reference(x, got[0], got[1])


@pytest.mark.cuda
@pytest.mark.skipif(not (CUDA and torch.cuda.device_count() > 1), reason="needs two GPUs")
def test_cuda_tensors_on_another_device_than_the_current_one(rng):
    x = make_problem(rng, B=1, T=100, H=2, state="fp32", cu_seqlens=[60, 40])
    t = to_torch(x, "cuda:1")
    with torch.cuda.device(0):
        call(t)
    torch.cuda.synchronize(1)
    check_against_reference(x, t["out"], t["final_state"])
