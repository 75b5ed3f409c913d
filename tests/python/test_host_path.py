"""How an eager call's arrays reach the C++ checker (docs/torch.md, "Host overhead"): flash_kda._C
reads plain torch tensors itself (torch's DLPack C exchange API) and sends everything else through
flash_kda._arrays.export_one. Both ways must give the same descriptions, the same results and the
same errors naming the argument: strided views, the negative bit (resolved as an input, rejected as
an output), conjugate and other wrong dtypes, meta tensors, tensor subclasses, NumPy arrays
(read-only ones, bf16 ones), DLPack capsules and non-arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from flash_kda import _C
from conftest import BF16, make_problem

torch = pytest.importorskip("torch")

# torch.Tensor's DLPack C exchange API (torch 2.10 and later); without it every tensor goes the
# general way, which the tests below cover as well.
HAS_EXCHANGE_API = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
needs_exchange_api = pytest.mark.skipif(not HAS_EXCHANGE_API, reason="torch without __dlpack_c_exchange_api__")

ARRAYS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")


def _tensor(a):
    if not isinstance(a, np.ndarray):
        return a
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).clone()
    return torch.from_numpy(a).clone()


def _problem(rng):
    x = make_problem(rng, B=1, T=20, H=2, state="fp32")
    return {n: _tensor(a) for n, a in x.items()}


def _fwd(t, **kw):
    out = torch.full_like(t["out"], float("nan"))
    final = torch.full_like(t["final_state"], float("nan"))
    args = dict(t, out=out, final_state=final)
    args.update(kw)
    flash_kda.fwd(args["q"], args["k"], args["v"], args["g"], args["beta"], args["scale"], args["out"],
                  args["A_log"], args["dt_bias"], args["lower_bound"], args["initial_state"], args["final_state"])
    return args["out"], args["final_state"]


def _same(a, b):
    return all(torch.equal(x.view(torch.int16) if x.dtype == torch.bfloat16 else x,
                           y.view(torch.int16) if y.dtype == torch.bfloat16 else y) for x, y in zip(a, b))


@needs_exchange_api
def test_plain_tensors_parameters_and_subclasses_are_read_directly():
    class Sub(torch.Tensor):
        pass

    x = torch.zeros(4)
    assert _C.reads_directly(x)
    assert _C.reads_directly(torch.nn.Parameter(x))
    assert _C.reads_directly(x.as_subclass(Sub))
    assert _C.reads_directly(x[::2])  # a strided view: its strides come along
    assert _C.reads_directly(torch.zeros(2, requires_grad=True))


def test_other_arrays_go_the_general_way():
    x = torch.zeros(4)
    assert not _C.reads_directly(None)
    assert not _C.reads_directly(np.zeros(4, np.float32))
    assert not _C.reads_directly(torch._neg_view(x))  # the bit must be resolved (a copy) or rejected
    assert not _C.reads_directly(torch.zeros(4, device="meta"))
    assert not _C.reads_directly([0.0] * 4)
    wrapper = getattr(torch.utils.dlpack, "ReadOnlyTensorWrapper", None)
    if wrapper is not None:  # a type with its own exchange API (read-only export)
        assert not _C.reads_directly(wrapper(x))


def test_tensors_numpy_and_subclasses_give_identical_results(rng):
    class Sub(torch.Tensor):
        pass

    x = make_problem(rng, B=1, T=20, H=2, state="fp32")
    t = {n: _tensor(a) for n, a in x.items()}
    reference = _fwd(t)
    assert not torch.isnan(reference[0].float()).any() and not torch.isnan(reference[1]).any()
    # nn.Parameter for the gate parameters (as in a model), a subclass for the activations
    as_params = dict(t, A_log=torch.nn.Parameter(t["A_log"]), dt_bias=torch.nn.Parameter(t["dt_bias"]),
                     q=t["q"].as_subclass(Sub), initial_state=t["initial_state"].as_subclass(Sub))
    assert _same(reference, _fwd(as_params))
    # NumPy arrays through the same call
    out, final = np.full_like(x["out"], np.nan), np.full_like(x["final_state"], np.nan)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, x["A_log"], x["dt_bias"],
                  x["lower_bound"], x["initial_state"], final)
    assert _same(reference, (_tensor(out), torch.from_numpy(final)))


def test_strided_views_are_described_with_their_strides(rng):
    t = _problem(rng)
    reference = _fwd(t)
    # q, k, v as slices of one packed buffer [B, T, 3H, K]; beta a column of a wider tensor
    packed = torch.cat([t["q"], t["k"], t["v"]], dim=2)
    H = t["q"].shape[2]
    wide = torch.stack([t["beta"], torch.zeros_like(t["beta"])], dim=-1)[..., 0]
    views = dict(t, q=packed[:, :, :H], k=packed[:, :, H:2 * H], v=packed[:, :, 2 * H:], beta=wide)
    assert not views["q"].is_contiguous() and not views["beta"].is_contiguous()
    assert _same(reference, _fwd(views))
    with pytest.raises(ValueError, match=r"^g: the last dimension must be contiguous"):
        _fwd(dict(t, g=torch.cat([t["g"], t["g"]], dim=3)[..., ::2]))
    with pytest.raises(ValueError, match=r"^initial_state: must be contiguous"):
        _fwd(dict(t, initial_state=t["initial_state"].transpose(2, 3)))


@pytest.mark.parametrize("name", ARRAYS)
def test_negative_bit_inputs_are_resolved(rng, name):
    t = _problem(rng)
    negated = (-t[name]).contiguous()
    lazily = torch._neg_view(t[name])
    assert lazily.is_neg()
    assert _same(_fwd(dict(t, **{name: negated})), _fwd(dict(t, **{name: lazily})))


@pytest.mark.parametrize("name", ["out", "final_state"])
def test_negative_bit_outputs_are_rejected(rng, name):
    t = _problem(rng)
    out, final = torch.zeros_like(t["out"]), torch.zeros_like(t["final_state"])
    args = dict(t, out=out, final_state=final)
    args[name] = torch._neg_view(args[name])
    with pytest.raises(ValueError, match=rf"^{name}: a tensor with the negative bit set"):
        flash_kda.fwd(args["q"], args["k"], args["v"], args["g"], args["beta"], args["scale"], args["out"],
                      args["A_log"], args["dt_bias"], args["lower_bound"], args["initial_state"],
                      args["final_state"])
    assert not out.any() and not final.any()  # nothing written


def test_decode_pool_with_the_negative_bit_is_rejected(rng):
    q = torch.zeros(2, 1, 1, 128, dtype=torch.bfloat16)
    pool = torch.zeros(4, 1, 128, 128)
    with pytest.raises(ValueError, match=r"^state: a tensor with the negative bit set"):
        flash_kda.decode(q, q, q, q, torch.zeros(2, 1, 1, dtype=torch.bfloat16), 0.1, torch.zeros_like(q),
                         torch.zeros(1), torch.zeros(128), -5.0, torch._neg_view(pool),
                         torch.tensor([0, 1], dtype=torch.int32))


@pytest.mark.parametrize("name,bad,error,message", [
    ("q", lambda a: a.to(torch.float16), TypeError, r"^q: dtype must be bf16 \(got float16\)"),
    ("A_log", lambda a: a.to(torch.float64), TypeError, r"^A_log: dtype must be fp32 \(got float64\)"),
    ("dt_bias", lambda a: torch.complex(a, a), TypeError, r"^dt_bias: dtype must be fp32 \(got complex64\)"),
    # the conjugate bit exists on complex tensors only: a dtype error, whichever way it goes
    ("A_log", lambda a: torch.complex(a, a).conj(), TypeError, r"^A_log: dtype must be fp32 \(got complex64\)"),
    ("k", lambda a: a[..., :64], ValueError, r"^k: expected shape"),
    ("v", lambda a: torch.empty(a.shape, dtype=a.dtype, device="meta"), ValueError, r"^v: "),
    ("beta", lambda a: a.tolist(), TypeError, r"^beta: expected a NumPy array or a torch tensor \(got list\)"),
    ("initial_state", lambda a: a.to_sparse(), ValueError, r"^initial_state: "),
])
def test_bad_tensors_are_errors_naming_the_argument(rng, name, bad, error, message):
    t = _problem(rng)
    with pytest.raises(error, match=message):
        _fwd(dict(t, **{name: bad(t[name])}))


def test_numpy_read_only_and_bf16_bits_still_reach_the_checker(rng):
    x = make_problem(rng, B=1, T=8, H=1, state="fp32")
    out = np.zeros_like(x["out"])
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: array is read-only"):
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], out, x["A_log"], x["dt_bias"],
                      x["lower_bound"], x["initial_state"], x["final_state"])
    # bf16 bits as uint16, declared through bf16_bits (positions q, k, v, g, beta, out), straight into _C
    y = {n: (a.view(np.uint16) if isinstance(a, np.ndarray) and a.dtype == BF16 else a) for n, a in x.items()}
    _C.fwd(y["q"], y["k"], y["v"], y["g"], y["beta"], y["scale"], y["out"], y["A_log"], y["dt_bias"],
           y["lower_bound"], y["initial_state"], y["final_state"], bf16_bits=0b111111)
    with pytest.raises(TypeError, match=r"^q: dtype must be bf16 \(got uint16\)"):
        _C.fwd(y["q"], y["k"], y["v"], y["g"], y["beta"], y["scale"], y["out"], y["A_log"], y["dt_bias"],
               y["lower_bound"], y["initial_state"], y["final_state"], bf16_bits=0b111110)


def test_dlpack_capsules_and_mixed_arguments_are_accepted(rng):
    t = _problem(rng)
    reference = _fwd(t)
    out, final = torch.full_like(t["out"], float("nan")), torch.full_like(t["final_state"], float("nan"))
    cap = torch.utils.dlpack.to_dlpack
    _C.fwd(cap(t["q"]), t["k"], t["v"], t["g"], t["beta"], t["scale"], cap(out), t["A_log"].numpy(),
           t["dt_bias"], t["lower_bound"], t["initial_state"], final)
    assert _same(reference, (out, final))


def test_backend_and_flags_are_converted_in_the_compiled_layer(rng):
    t = _problem(rng)
    with pytest.raises(ValueError, match=r"^backend: expected None, 'cuda', 'cpu' or 'reference' \(got '3'\)"):
        flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"], t["dt_bias"],
                      t["lower_bound"], backend=3)
    with pytest.raises(ValueError, match=r"^backend: .*\(got 'gpu'\)"):
        flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], t["out"], t["A_log"], t["dt_bias"],
                      t["lower_bound"], backend="gpu")
    # allow_neg_eigval: any truth value (as bool() takes it)
    a, b = (torch.zeros_like(t["out"]) for _ in range(2))
    for out, flag in ((a, True), (b, 1)):
        flash_kda.fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["scale"], out, t["A_log"], t["dt_bias"],
                      t["lower_bound"], allow_neg_eigval=flag)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
