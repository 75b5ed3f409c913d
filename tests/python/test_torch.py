"""torch tensors: CPU tensors on the CPU backend, CUDA tensors on the kernels (skipped without them)."""

from __future__ import annotations

import numpy as np
import pytest

import flash_kda
from conftest import (BF16, OUT_LIMIT, call, make_problem, reference_numpy, rel, state_limit,
                      with_fresh_outputs)

torch = pytest.importorskip("torch")

needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and flash_kda.cuda_available()),
    reason="needs torch with CUDA and a CUDA build of flash-kda on an sm_90 GPU",
)


def to_torch(x, device="cpu"):
    """The NumPy problem `x` as torch tensors (same bits)."""
    def convert(a):
        if not isinstance(a, np.ndarray):
            return a
        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
        return torch.from_numpy(a).to(device)
    return {n: convert(a) for n, a in x.items()}


def to_numpy(t):
    if t.dtype == torch.bfloat16:
        return t.cpu().view(torch.int16).numpy().view(BF16)
    return t.cpu().numpy()


@pytest.mark.parametrize("state", [None, "fp32", "bf16"])
def test_cpu_tensors_match_numpy_bit_for_bit(rng, state):
    x = make_problem(rng, B=1, T=150, H=2, state=state, cu_seqlens=[100, 0, 50])
    t = to_torch(x)
    call(t)
    call(x)
    np.testing.assert_array_equal(to_numpy(t["out"]).view(np.uint16), x["out"].view(np.uint16))
    if state:
        np.testing.assert_array_equal(to_numpy(t["final_state"]).view(np.uint8),
                                      x["final_state"].view(np.uint8))


def test_cpu_tensor_views_and_in_place_state(rng):
    B, T, H, K = 2, 40, 2, 128
    x = make_problem(rng, B=B, T=T, H=H, state="fp32")
    qkv = torch.randn(B, T, 3, H, K, dtype=torch.bfloat16)
    t = to_torch(x)
    t.update(q=qkv[:, :, 0], k=qkv[:, :, 1], v=qkv[:, :, 2])
    state = t["initial_state"].clone()
    call(t, initial_state=state, final_state=state)
    ref = with_fresh_outputs(x)
    ref.update(q=to_numpy(qkv[:, :, 0].contiguous()), k=to_numpy(qkv[:, :, 1].contiguous()),
               v=to_numpy(qkv[:, :, 2].contiguous()))
    out64, state64 = reference_numpy(ref)
    assert rel(to_numpy(t["out"]), out64) <= OUT_LIMIT
    assert rel(to_numpy(state), state64) <= state_limit(np.float32)


def test_requires_grad_inputs_are_accepted(rng):
    x = make_problem(rng, B=1, T=20, H=1)
    t = to_torch(x)
    t["A_log"].requires_grad_(True)
    call(t)
    assert torch.isfinite(t["out"].float()).all()


def test_torch_dtype_errors_name_the_argument(rng):
    t = to_torch(make_problem(rng, B=1, T=20, H=1, state="fp32"))
    with pytest.raises(TypeError, match=r"^q: dtype must be bf16 \(got float16\)"):
        call(t, q=t["q"].half())
    with pytest.raises(TypeError, match=r"^final_state: "):
        call(t, final_state=t["final_state"].double())
    assert torch.isnan(t["out"].float()).all()


def test_numpy_and_torch_cpu_mix(rng):
    x = make_problem(rng, B=1, T=20, H=1)
    t = to_torch(x)
    call(x, q=t["q"], out=t["out"])
    assert torch.isfinite(t["out"].float()).all()


# ---- CUDA ----

@needs_cuda
@pytest.mark.parametrize("state", [None, "fp32", "bf16"])
@pytest.mark.parametrize("cu", [None, [300, 17, 0, 700, 1]])
@pytest.mark.parametrize("dim", [128, 64])  # K = V: the CUDA forward's two head dimensions
def test_cuda_matches_reference(rng, state, cu, dim):
    T = 1018 if cu else 257
    x = make_problem(rng, B=1 if cu else 2, T=T, H=4, K=dim, V=dim, state=state, cu_seqlens=cu)
    t = to_torch(x, "cuda")
    call(t)
    torch.cuda.synchronize()
    out64, state64 = reference_numpy(x)
    out = to_numpy(t["out"])
    assert np.isfinite(out.astype(np.float32)).all()
    assert rel(out, out64) <= OUT_LIMIT
    if state:
        assert rel(to_numpy(t["final_state"]), state64) <= state_limit(x["final_state"].dtype)


@needs_cuda
def test_cuda_mixed_devices(rng):
    t = to_torch(make_problem(rng, B=1, T=32, H=2, state="fp32"), "cuda")
    with pytest.raises(ValueError, match=r"^k: on device cpu"):
        call(t, k=t["k"].cpu())
    with pytest.raises(ValueError, match=r"^backend: "):
        call(t, backend="cpu")
    assert torch.isnan(t["out"].float()).all()


@needs_cuda
@pytest.mark.parametrize("values", [[1, 16, 32], [0, 20, 10, 32], [0, 16, 31]])
def test_cuda_cu_seqlens_contents_are_checked(rng, values):
    x = make_problem(rng, B=1, T=32, H=2, cu_seqlens=[16, 16])
    t = to_torch(x, "cuda")
    with pytest.raises(ValueError, match=r"^cu_seqlens: "):
        call(t, cu_seqlens=torch.tensor(values, device="cuda"))
    assert torch.isnan(t["out"].float()).all()


@needs_cuda
def test_cuda_runs_on_the_current_stream_and_in_a_graph(rng):
    x = make_problem(rng, B=1, T=200, H=2, state="fp32", cu_seqlens=[150, 50])
    t = to_torch(x, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call(t)
    stream.synchronize()
    eager = t["out"].clone()

    t["out"].fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(t)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(t["out"].view(torch.int16), eager.view(torch.int16))
