"""End-to-end prefill: a stack of fla's KDA layers with random weights, fla's Triton chunk_kda
against flash-kda, and how much of the kernel speedup reaches the stack (Amdahl).

Each block mirrors fla's KDABlock (fla.models.kda): RMSNorm -> KimiDeltaAttention (fla.layers.kda:
q/k/v projections, short convolutions, f/g low-rank projections, the KDA op, gated RMSNorm, o_proj)
-> residual, then, in the "+ MLP" stacks (--mlp with|both), fused add+RMSNorm -> GatedMLP (SwiGLU)
-> residual. The MLP is dense with the width of the model's activated MoE experts (routed +
shared), standing in for the MoE's arithmetic (not its routing); the "KDA only" stacks leave it out.
The real models also hold full-attention (MLA) layers, which neither stack has. Weights are random (nn.Linear's default initialisation);
the KDA layers use the safe gate with lower_bound = -5 (the gate fla dispatches to flash-kda).

Three variants of the same stack on the same input, interleaved rep by rep, under
torch.inference_mode():
  fla        FLA_FLASH_KDA=0: fla's Triton chunk_kda;
  flash-kda  FLA_FLASH_KDA=1: fla's own dispatch to flash_kda.fwd (its FlashKDA backend); the calls
             are counted, so a stack that silently stayed on Triton is reported as an error;
  no-op      chunk_kda replaced by a function returning an uninitialised tensor of its output's
             shape: the rest of the stack.
Then, on the KDA op's inputs captured from the first layer: the op alone through fla's chunk_kda
with FLA_FLASH_KDA=0 and =1 (eager, as the layer calls it).

  f        = (t_fla - t_noop) / t_fla          the KDA op's share of the stack's time (fla)
  s        = t_op_fla / t_op_flash_kda         the kernel speedup
  Amdahl   = 1 / (1 - f + f / s)               the predicted stack speedup
  measured = t_fla / t_flash_kda               the stack speedup
"""

from __future__ import annotations

import importlib
import os

from .cases import LOWER_BOUND
from .timing import Progress, summarize, time_cuda

CONFIGS = {
    "kimi-linear": dict(
        hidden=2304, heads=32, head_dim=128, intermediate=9216, layers=4,
        what="Kimi-Linear-48B-A3B-like: hidden 2304, 32 KDA heads x 128; MLP 9216 = (8 routed + 1 shared) x 1024"),
    "k3-shard": dict(
        hidden=7168, heads=96, head_dim=128, intermediate=18432, layers=2,
        what="Kimi-K3-like shard: 96 KDA heads x 128 on one GPU, hidden 7168; MLP 18432 = (8 + 1) x 2048"),
}


def unavailable():
    """None when the end-to-end measurement can run here, else why it cannot."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    import flash_kda

    if not flash_kda.cuda_available():
        return "this flash-kda build has no usable CUDA backend (built without CUDA, or not an sm_90 GPU)"
    try:
        import fla.layers.kda  # noqa: F401
        import fla.modules  # noqa: F401
    except Exception as e:  # ImportError, or fla failing on this torch/triton
        return f"fla (flash-linear-attention) is not importable: {type(e).__name__}: {e}"
    return None


def _build(torch, cfg, device="cuda"):
    from fla.layers.kda import KimiDeltaAttention
    from fla.modules import GatedMLP, RMSNorm

    class Block(torch.nn.Module):
        def __init__(self, idx):
            super().__init__()
            self.attn_norm = RMSNorm(cfg["hidden"], eps=1e-6)
            self.attn = KimiDeltaAttention(
                hidden_size=cfg["hidden"], head_dim=cfg["head_dim"], num_heads=cfg["heads"], mode="chunk",
                use_short_conv=True, safe_gate=True, lower_bound=LOWER_BOUND, layer_idx=idx)
            self.mlp_norm = RMSNorm(cfg["hidden"], eps=1e-6)
            self.mlp = GatedMLP(hidden_size=cfg["hidden"], intermediate_size=cfg["intermediate"],
                                hidden_act="swish", fuse_swiglu=True)
            self.use_mlp = True  # False: the KDA sublayer alone (set by the caller)

        def forward(self, x):
            residual = x
            h, _, _ = self.attn(self.attn_norm(x), use_cache=True)  # use_cache: final state written
            if not self.use_mlp:
                return residual + h
            h, residual = self.mlp_norm(h, residual, True)  # fused add + RMSNorm (KDABlock's fuse_norm)
            return residual + self.mlp(h)

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block(i) for i in range(cfg["layers"]))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = Stack().to(device=device, dtype=torch.bfloat16).eval()
    for block in model.blocks:  # the gate's parameters stay fp32, as fla creates them
        block.attn.A_log.data = block.attn.A_log.data.float()
        block.attn.dt_bias.data = block.attn.dt_bias.data.float()
    return model


def run(config_names=None, tokens=(8192, 32768), layers=None, reps=7, mlp=("with", "without"), seed=None,
        progress=True, on_row=None):
    """Runs the end-to-end measurement; returns the rows. Needs CUDA, fla and flash-kda's CUDA build.
    `mlp`: which stacks to time, "with" the MLPs and/or "without" them (the KDA sublayers alone)."""
    import torch

    names = list(CONFIGS) if not config_names or list(config_names) == ["all"] else list(config_names)
    for n in names:
        if n not in CONFIGS:
            raise ValueError(f"unknown e2e config {n!r}; known: {', '.join(CONFIGS)}")
    for v in mlp:
        if v not in ("with", "without"):
            raise ValueError(f"mlp variant {v!r}: expected 'with' or 'without'")
    if seed is not None:
        torch.manual_seed(seed)
    rows = []
    with Progress(len(names) * len(tokens) * len(mlp), "e2e (cuda)", progress) as bar:
        for name in names:
            cfg = dict(CONFIGS[name])
            if layers:
                cfg["layers"] = layers
            bar.step(f"{name}: building")
            model = _build(torch, cfg)
            for T in tokens:
                x = torch.randn(1, T, cfg["hidden"], device="cuda", dtype=torch.bfloat16)
                for variant in mlp:
                    for block in model.blocks:
                        block.use_mlp = variant == "with"
                    row = _measure(torch, model, x, cfg, name, variant == "with", reps, bar)
                    rows.append(row)
                    bar.write(_line(row))
                    if on_row:
                        on_row(rows)
                    bar.update()
                del x
                torch.cuda.empty_cache()
            del model
            torch.cuda.empty_cache()
    return rows


def _measure(torch, model, x, cfg, name, mlp, reps, bar):
    """One stack on one input: the three variants, the op alone, f, s, Amdahl, measured."""
    from fla.ops.kda import chunk_kda as dispatched_chunk_kda

    from .speed import count_fwd_calls

    kda_mod = importlib.import_module("fla.layers.kda")
    T = x.shape[1]
    tag = f"{name} T={T} {'+mlp' if mlp else 'kda only'}"
    saved_env = os.environ.get("FLA_FLASH_KDA")
    captured = {}

    def capture(**kw):
        if not captured:
            captured.update(kw)
        return dispatched_chunk_kda(**kw)

    def noop(**kw):
        return torch.empty_like(kw["v"]), None

    def forward(mode):
        os.environ["FLA_FLASH_KDA"] = "0" if mode == "fla" else "1"
        kda_mod.chunk_kda = noop if mode == "no-op" else dispatched_chunk_kda
        with torch.inference_mode():
            return model(x)

    def op_call(mode):
        os.environ["FLA_FLASH_KDA"] = "0" if mode == "fla" else "1"
        with torch.inference_mode():
            return dispatched_chunk_kda(**captured)

    modes = ("fla", "flash-kda", "no-op")
    times = {m: [] for m in modes}
    calls = {}
    try:
        # warm-up (fla autotunes here) and the dispatch check: flash_kda.fwd calls per forward
        for m in modes:
            bar.step(f"{tag}: warm-up {m}")
            with count_fwd_calls() as n_calls:
                forward(m)
                forward(m)
                torch.cuda.synchronize()
            calls[m] = n_calls[0] // 2
        # the op's inputs, from the first layer
        os.environ["FLA_FLASH_KDA"] = "0"
        kda_mod.chunk_kda = capture
        with torch.inference_mode():
            model.blocks[0](x)
        kda_mod.chunk_kda = dispatched_chunk_kda
        bar.step(f"{tag}: timing")
        for _ in range(reps):  # interleaved, so that drift hits every mode alike
            for m in modes:
                times[m] += time_cuda(torch, lambda: forward(m), 1, warmup=0)
        kda_mod.chunk_kda = dispatched_chunk_kda
        # the op alone on the layer's inputs, eager, as the layer calls it
        op = {m: summarize(time_cuda(torch, lambda: op_call(m), max(reps, 10), warmup=3))
              for m in ("fla", "flash-kda")}
        # the two ops against each other on these real-layer inputs
        o_fla, _ = op_call("fla")
        o_ours, _ = op_call("flash-kda")
        ref = o_fla.float()
        ours_vs_fla = float((o_ours.float() - ref).norm() / ref.norm())
        del o_fla, o_ours, ref
        verdict = _why_not_dispatched(torch, captured) if calls["flash-kda"] == 0 else None
    finally:
        kda_mod.chunk_kda = dispatched_chunk_kda
        if saved_env is None:
            os.environ.pop("FLA_FLASH_KDA", None)
        else:
            os.environ["FLA_FLASH_KDA"] = saved_env
    captured.clear()
    stack = {m: summarize(times[m]) for m in modes}
    t_fla, t_ours, t_noop = (stack[m]["median_ms"] for m in modes)
    f = (t_fla - t_noop) / t_fla
    s = op["fla"]["median_ms"] / op["flash-kda"]["median_ms"]
    row = dict(
        config=name, what=cfg["what"], hidden=cfg["hidden"], heads=cfg["heads"], head_dim=cfg["head_dim"],
        mlp=mlp, intermediate=cfg["intermediate"] if mlp else None, layers=cfg["layers"], tokens=T,
        stack=stack, op=op, t_fla_ms=t_fla, t_flash_kda_ms=t_ours, t_noop_ms=t_noop,
        f=f, f_from_op=cfg["layers"] * op["fla"]["median_ms"] / t_fla, s=s,
        amdahl=1.0 / (1.0 - f + f / s), measured=t_fla / t_ours,
        flash_kda_calls_per_forward=calls, ours_vs_fla_out_rel=ours_vs_fla,
        dispatch_ok=calls["flash-kda"] == cfg["layers"] and calls["fla"] == 0 and calls["no-op"] == 0,
    )
    if verdict:
        row["dispatch_rejected"] = verdict
    return row


def _why_not_dispatched(torch, kw):
    """fla's own verdict on the captured call (why its FlashKDA backend would refuse it)."""
    try:
        from fla.ops.kda.backends.flash_kda import FlashKDABackend

        with torch.inference_mode():
            ok, reason = FlashKDABackend().verify("chunk_kda", **kw)
        return "accepted by the verifier, yet flash_kda.fwd was not called" if ok else reason
    except Exception as e:
        return f"could not ask fla's verifier: {type(e).__name__}: {e}"


def _line(r):
    text = (f"{r['config']:<12s} T={r['tokens']:<6d} L={r['layers']} {'+mlp' if r['mlp'] else 'kda '}  stack fla {r['t_fla_ms']:8.2f} ms  "
            f"flash-kda {r['t_flash_kda_ms']:8.2f} ms  no-op {r['t_noop_ms']:8.2f} ms | f {r['f']:.3f}  "
            f"s {r['s']:.2f}  Amdahl {r['amdahl']:.3f}x  measured {r['measured']:.3f}x")
    if not r["dispatch_ok"]:
        text += (f"  DISPATCH FAILED (flash_kda.fwd calls per forward: {r['flash_kda_calls_per_forward']}"
                 f"; {r.get('dispatch_rejected', '')})")
    return text
