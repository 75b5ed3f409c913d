"""flash-linear-attention 0.6.0 dispatches chunk_kda to flash-kda (needs an sm_90 GPU and fla).

    PYTHONPATH=/tmp/site python -m pytest tests/gpu -v -rs     (tests/gpu/run_h200.sh does it all)

What fla does (fla/backends.py, fla/ops/kda/backends/flash_kda.py): its FlashKDA backend is tried
before the Triton kernels on every call of fla.ops.kda.chunk_kda when the package `flash_kda` is
importable and FLA_FLASH_KDA is not "0" (read from the environment on every call), and accepts the
call when grad mode is off (torch.inference_mode() or torch.no_grad()), q is bf16, K = V = 128,
HV = H, use_gate_in_kernel, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel and safe_gate are
True, allow_neg_eigval is False, A_log and dt_bias are given, state_v_first is True, and neither
cp_context nor return_intermediate_states is used. It then allocates out and an fp32 final state
and calls flash_kda.fwd(q, k, v, g, beta, scale, out, A_log=, dt_bias=, lower_bound=,
initial_state=, final_state=, cu_seqlens=), looking flash_kda.fwd up at call time, so counting the
calls of a wrapper proves which path ran. fla logs "[FLA Backend] ... -> flash_kda" at INFO level
once per process; test_dispatch_log checks it in a fresh process.

Accuracy is judged against the float64 recurrence (flash_kda.reference on host copies of the same
inputs) with docs/spec.md's limits; fla's Triton path itself is about 4e-3 off, so it is held to 1e-2.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import flash_kda  # noqa: E402

if not (torch.cuda.is_available() and flash_kda.cuda_available()):
    pytest.skip("needs torch with CUDA and a CUDA build of flash-kda on an sm_90 GPU",
                allow_module_level=True)
fla_kda = pytest.importorskip("fla.ops.kda", reason="fla (flash-linear-attention) is not importable")

OUT_LIMIT, STATE_LIMIT = 4e-3, 3e-3  # docs/spec.md, fp32 state
FLA_LIMIT = 1e-2  # fla's Triton chunk_kda against float64 (measured ~4e-3) and against flash-kda
LENS = [300, 17, 700, 1]  # docs/spec.md's reference case
H, K = 4, 128


def rel(x, ref):
    x = x.detach().to("cpu", torch.float64).numpy() if isinstance(x, torch.Tensor) else x
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / norm)


class Problem:
    """Fresh random inputs on the GPU (normal q, k, v, g, beta; uniform A_log, dt_bias; normal
    fp32 initial state), packed by cu_seqlens, or B rows without."""

    def __init__(self, lens=LENS, B=None, state=True):
        seed = int(np.random.SeedSequence().entropy % 2**63)
        print(f"seed = {seed}")
        gen = torch.Generator(device="cpu").manual_seed(seed)
        if B is None:
            B, T, N = 1, sum(lens), len(lens)
            self.cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int64, device="cuda")
        else:
            T, N, self.cu = lens, B, None
        normal = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16).cuda()  # noqa: E731
        self.q, self.k, self.v, self.g = (normal(B, T, H, K) for _ in range(4))
        self.beta = normal(B, T, H)
        self.A_log = torch.rand(H, generator=gen).cuda()
        self.dt_bias = torch.rand(H * K, generator=gen).cuda()  # fla's layout: [HV * K]
        self.h0 = torch.randn(N, H, K, K, generator=gen).cuda() if state else None
        self.scale = K ** -0.5

    def fla(self, **overrides):
        kw = dict(q=self.q, k=self.k, v=self.v, g=self.g, beta=self.beta, scale=self.scale,
                  initial_state=None if self.h0 is None else self.h0.clone(),
                  output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                  state_v_first=True, cu_seqlens=self.cu, A_log=self.A_log, dt_bias=self.dt_bias)
        kw.update(overrides)
        return fla_kda.chunk_kda(**kw)

    def reference(self):
        return flash_kda.reference(self.q, self.k, self.v, self.g, self.beta, self.scale, self.A_log,
                                   self.dt_bias, -5.0, self.h0, None if self.cu is None else self.cu.cpu())


@pytest.fixture
def fwd_calls(monkeypatch):
    """Counts the calls of flash_kda.fwd (fla looks it up at call time)."""
    calls = []
    real = flash_kda.fwd

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(flash_kda, "fwd", counting)
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    return calls


def test_inference_mode_runs_flash_kda(fwd_calls):
    p = Problem()
    with torch.inference_mode():
        o, ht = p.fla()
    torch.cuda.synchronize()
    assert len(fwd_calls) == 1
    assert fwd_calls[0]["lower_bound"] == -5.0 and fwd_calls[0]["cu_seqlens"] is not None
    ref_o, ref_s = p.reference()
    e_o, e_s = rel(o, ref_o), rel(ht, ref_s)
    print(f"fla -> flash-kda: out rel {e_o:.3e}, final_state rel {e_s:.3e}")
    assert ht.dtype == torch.float32 and ht.shape == (len(LENS), H, K, K)
    assert torch.isfinite(o.float()).all() and torch.isfinite(ht).all()
    assert e_o <= OUT_LIMIT and e_s <= STATE_LIMIT


def test_matches_fla_triton_path(fwd_calls, monkeypatch):
    """The same inputs through flash-kda (dispatched) and through fla's Triton kernels
    (FLA_FLASH_KDA=0), both against float64."""
    p = Problem()
    with torch.inference_mode():
        ours_o, ours_s = p.fla()
        monkeypatch.setenv("FLA_FLASH_KDA", "0")
        tri_o, tri_s = p.fla()
    torch.cuda.synchronize()
    assert len(fwd_calls) == 1  # only the first call came to flash-kda
    ref_o, ref_s = p.reference()
    errors = dict(ours_out=rel(ours_o, ref_o), ours_state=rel(ours_s, ref_s),
                  triton_out=rel(tri_o, ref_o), triton_state=rel(tri_s, ref_s),
                  ours_vs_triton_out=rel(ours_o, tri_o.double().cpu().numpy()),
                  ours_vs_triton_state=rel(ours_s, tri_s.double().cpu().numpy()))
    print("errors: " + ", ".join(f"{k} {v:.3e}" for k, v in errors.items()))
    assert errors["ours_out"] <= OUT_LIMIT and errors["ours_state"] <= STATE_LIMIT
    assert errors["triton_out"] <= FLA_LIMIT and errors["triton_state"] <= FLA_LIMIT
    assert errors["ours_vs_triton_out"] <= FLA_LIMIT and errors["ours_vs_triton_state"] <= FLA_LIMIT


def test_env_var_zero_falls_back_to_triton(fwd_calls, monkeypatch):
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    p = Problem()
    with torch.inference_mode():
        o, ht = p.fla()
    torch.cuda.synchronize()
    assert fwd_calls == []
    ref_o, ref_s = p.reference()
    assert rel(o, ref_o) <= FLA_LIMIT and rel(ht, ref_s) <= FLA_LIMIT


def test_grad_mode_uses_triton(fwd_calls):
    """Outside inference mode / no_grad fla's FlashKDA backend declines (training path)."""
    p = Problem()
    o, ht = p.fla()
    torch.cuda.synchronize()
    assert fwd_calls == []
    ref_o, _ = p.reference()
    assert rel(o, ref_o) <= FLA_LIMIT


def test_no_grad_fixed_batch_without_state(fwd_calls):
    p = Problem(lens=333, B=2, state=False)  # T = 333 tokens per row
    with torch.no_grad():
        o, ht = p.fla()
    torch.cuda.synchronize()
    assert len(fwd_calls) == 1
    ref_o, ref_s = p.reference()
    assert rel(o, ref_o) <= OUT_LIMIT and rel(ht, ref_s) <= STATE_LIMIT


def test_declined_calls_are_not_dispatched(fwd_calls):
    """Options the backend's verifier rejects go to Triton (here: state_v_first=False)."""
    p = Problem()
    with torch.inference_mode():
        p.fla(state_v_first=False, initial_state=p.h0.transpose(2, 3).contiguous())
    torch.cuda.synchronize()
    assert fwd_calls == []


def test_cuda_graph_of_the_fla_call(fwd_calls):
    """fla's chunk_kda (dispatched to flash-kda) captured in a CUDA graph and replayed on new
    inputs, including a new split of the packed tokens."""
    p = Problem()
    with torch.inference_mode():
        p.fla()  # warm-up
        torch.cuda.synchronize()
        h0 = p.h0.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, ht = p.fla(initial_state=h0)
        new = Problem(lens=[500, 1, 0, 517])
        for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "cu"):
            getattr(p, name).copy_(getattr(new, name))
        h0.copy_(new.h0)
        p.h0 = new.h0
        o.fill_(float("nan"))
        ht.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    assert len(fwd_calls) == 2
    ref_o, ref_s = p.reference()
    assert rel(o, ref_o) <= OUT_LIMIT and rel(ht, ref_s) <= STATE_LIMIT


DISPATCH_SCRIPT = r"""
import logging, torch
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from fla.ops.kda import chunk_kda
T, H, K = 64, 2, 128
r = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)
with torch.inference_mode():
    chunk_kda(q=r(1, T, H, K), k=r(1, T, H, K), v=r(1, T, H, K), g=r(1, T, H, K), beta=r(1, T, H),
              A_log=torch.rand(H, device="cuda"), dt_bias=torch.rand(H * K, device="cuda"),
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              safe_gate=True, lower_bound=-5.0, state_v_first=True, output_final_state=True)
torch.cuda.synchronize()
"""


@pytest.mark.parametrize("env,expect", [(None, True), ("0", False)], ids=["default", "FLA_FLASH_KDA=0"])
def test_dispatch_log(env, expect):
    """fla's own log line, from a fresh process (fla logs each dispatch decision once)."""
    environ = dict(os.environ)
    environ.pop("FLA_FLASH_KDA", None)
    if env is not None:
        environ["FLA_FLASH_KDA"] = env
    r = subprocess.run([sys.executable, "-c", DISPATCH_SCRIPT], capture_output=True, text=True,
                       env=environ, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    dispatched = "chunk_kda -> flash_kda" in r.stderr
    assert dispatched == expect, r.stderr[-3000:]
