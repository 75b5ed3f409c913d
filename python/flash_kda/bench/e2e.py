"""End-to-end prefill: a stack of fla's KDA layers with random weights, fla's Triton chunk_kda
against flash-kda, and how much of the kernel speedup reaches the stack (Amdahl).

Each block mirrors fla's KDABlock (fla.models.kda): RMSNorm -> KimiDeltaAttention (fla.layers.kda:
q/k/v projections, short convolutions, f/g low-rank projections, the KDA op, gated RMSNorm, o_proj)
-> residual, then, in the "+ MLP" stacks (--mlp with|both), fused add+RMSNorm -> GatedMLP (SwiGLU)
-> residual. The MLP is dense with the width of the model's activated MoE experts (routed +
shared), standing in for the MoE's arithmetic (not its routing); the "KDA only" stacks leave it out.
The real models also hold full-attention (MLA) layers, which neither stack has. Weights are random
(nn.Linear's default initialisation; A_log and dt_bias as fla initialises them, kept in fp32).

The gate of a configuration ("gate" in CONFIGS) decides how flash-kda gets into the stack:
  safe      the KDA layers use the safe gate with lower_bound = -5, the gate fla dispatches to
            flash-kda by itself (its FlashKDA backend, flash_kda.fwd);
  softplus  the KDA layers use fla's unbounded gate -exp(A_log) * softplus(g + dt_bias) (safe_gate
            False, lower_bound None: Kimi-Linear-48B-A3B as trained), which fla's dispatch does not
            send to flash-kda; the layers' chunk_kda is replaced by flash_kda.chunk_kda, called with
            the same arguments (what a Kimi-Linear user does, docs/torch.md "Kimi-Linear").

Three variants of the same stack on the same input, interleaved rep by rep, under
torch.inference_mode():
  fla        FLA_FLASH_KDA=0: fla's Triton chunk_kda;
  flash-kda  safe: FLA_FLASH_KDA=1, fla's own dispatch to flash_kda.fwd; softplus: flash_kda.chunk_kda
             in place of fla's chunk_kda. The calls of flash-kda are counted in every variant, so a
             stack that silently stayed on Triton (or a fla variant that did not) is reported as an
             error;
  no-op      chunk_kda replaced by a function returning an uninitialised tensor of its output's
             shape: the rest of the stack.
Then, on the KDA op's inputs captured from the first layer: the op alone as the fla and the
flash-kda variants call it (eager, as the layer calls it).

  f        = (t_fla - t_noop) / t_fla          the KDA op's share of the stack's time (fla)
  s        = t_op_fla / t_op_flash_kda         the kernel speedup
  Amdahl   = 1 / (1 - f + f / s)               the predicted stack speedup
  measured = t_fla / t_flash_kda               the stack speedup
"""

from __future__ import annotations

import importlib
import os
import re

from .cases import LOWER_BOUND
from .timing import Progress, summarize, time_cuda

CONFIGS = {
    "kimi-linear": dict(
        hidden=2304, heads=32, head_dim=128, intermediate=9216, layers=4, gate="safe",
        what="Kimi-Linear-48B-A3B-like: hidden 2304, 32 KDA heads x 128; MLP 9216 = (8 routed + 1 shared) x 1024"),
    "kimi-linear-softplus": dict(
        hidden=2304, heads=32, head_dim=128, intermediate=9216, layers=4, gate="softplus",
        what=("Kimi-Linear-48B-A3B-like with its trained gate, the unbounded softplus gate (no lower bound; "
              "A_log = log U(1, 16) as fla initialises it): hidden 2304, 32 KDA heads x 128; MLP 9216; "
              "flash-kda through flash_kda.chunk_kda")),
    "k3-shard": dict(
        hidden=7168, heads=96, head_dim=128, intermediate=18432, layers=2, gate="safe",
        what="Kimi-K3-like shard: 96 KDA heads x 128 on one GPU, hidden 7168; MLP 18432 = (8 + 1) x 2048"),
}

# The gate forms of the stacks: fla.layers.kda.KimiDeltaAttention's arguments, and how the flash-kda
# variant reaches flash-kda (`route`, recorded in each row): "fla-dispatch", fla's own dispatch to
# flash_kda.fwd (FLA_FLASH_KDA=1); "chunk_kda", flash_kda.chunk_kda in place of fla's chunk_kda.
GATES = {
    "safe": dict(safe_gate=True, lower_bound=LOWER_BOUND, route="fla-dispatch"),
    "softplus": dict(safe_gate=False, lower_bound=None, route="chunk_kda"),
}
MODES = ("fla", "flash-kda", "no-op")


def parse_tokens(text):
    """A prefill length from the command line: '8192', or with a K suffix '8K' / '32k' (x 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", str(text))
    if not m:
        raise ValueError(f"{text!r}: expected a number of tokens, e.g. 8192 or 8K")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def _noop(**kw):
    """The no-op variant's KDA op: an uninitialised tensor of the output's shape, no final state."""
    return kw["v"].new_empty(kw["v"].shape), None


def routes(gate, fla_chunk_kda, flash_kda_chunk_kda):
    """What the KDA layers of each variant call, and FLA_FLASH_KDA while they do: {mode: (env,
    function)}. `fla_chunk_kda`: fla's chunk_kda (its dispatch decides on FLA_FLASH_KDA);
    `flash_kda_chunk_kda`: flash-kda's (flash_kda.chunk_kda, or a wrapper counting its calls)."""
    if gate not in GATES:
        raise ValueError(f"gate {gate!r}: expected one of {', '.join(GATES)}")
    ours = ("1", fla_chunk_kda) if GATES[gate]["route"] == "fla-dispatch" else ("0", flash_kda_chunk_kda)
    return {"fla": ("0", fla_chunk_kda), "flash-kda": ours, "no-op": ("0", _noop)}


def expected_calls(cfg):
    """flash-kda calls per forward of each variant when the stack runs as meant: one per layer in the
    flash-kda variant, none in the others (the fla variant is fla's Triton path)."""
    return {"fla": 0, "flash-kda": cfg["layers"], "no-op": 0}


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

    gate = GATES[cfg.get("gate", "safe")]

    class Block(torch.nn.Module):
        def __init__(self, idx):
            super().__init__()
            self.attn_norm = RMSNorm(cfg["hidden"], eps=1e-6)
            self.attn = KimiDeltaAttention(
                hidden_size=cfg["hidden"], head_dim=cfg["head_dim"], num_heads=cfg["heads"], mode="chunk",
                use_short_conv=True, safe_gate=gate["safe_gate"], lower_bound=gate["lower_bound"], layer_idx=idx)
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

    model = Stack()
    gate_params = [(b.attn.A_log.data.clone(), b.attn.dt_bias.data.clone()) for b in model.blocks]
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    for block, (A_log, dt_bias) in zip(model.blocks, gate_params):  # fp32, the values fla initialised
        block.attn.A_log.data = A_log.to(device)
        block.attn.dt_bias.data = dt_bias.to(device)
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
    import flash_kda
    from fla.ops.kda import chunk_kda as dispatched_chunk_kda

    from .speed import count_fwd_calls

    kda_mod = importlib.import_module("fla.layers.kda")
    T = x.shape[1]
    tag = f"{name} T={T} {'+mlp' if mlp else 'kda only'}"
    gate = cfg.get("gate", "safe")
    saved_env = os.environ.get("FLA_FLASH_KDA")
    captured = {}
    chunk_calls = [0]

    def ours_chunk_kda(**kw):  # flash_kda.chunk_kda, counted
        chunk_calls[0] += 1
        return flash_kda.chunk_kda(**kw)

    route = routes(gate, dispatched_chunk_kda, ours_chunk_kda)

    def capture(**kw):
        if not captured:
            captured.update(kw)
        return dispatched_chunk_kda(**kw)

    def forward(mode):
        os.environ["FLA_FLASH_KDA"], kda_mod.chunk_kda = route[mode]
        with torch.inference_mode():
            return model(x)

    def op_call(mode):
        os.environ["FLA_FLASH_KDA"], fn = route[mode]
        with torch.inference_mode():
            return fn(**captured)

    modes = MODES
    times = {m: [] for m in modes}
    calls = {}
    try:
        # warm-up (fla autotunes here) and the dispatch check: flash-kda calls per forward (of
        # flash_kda.fwd, as fla's backend calls it, and of flash_kda.chunk_kda by the layers)
        for m in modes:
            bar.step(f"{tag}: warm-up {m}")
            chunk_calls[0] = 0
            with count_fwd_calls() as n_calls:
                forward(m)
                forward(m)
                torch.cuda.synchronize()
            calls[m] = (n_calls[0] + chunk_calls[0]) // 2
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
        verdict = _verdict(torch, cfg, calls, captured)
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
        gate=gate, lower_bound=GATES[gate]["lower_bound"], route=GATES[gate]["route"],
        stack=stack, op=op, t_fla_ms=t_fla, t_flash_kda_ms=t_ours, t_noop_ms=t_noop,
        f=f, f_from_op=cfg["layers"] * op["fla"]["median_ms"] / t_fla, s=s,
        amdahl=1.0 / (1.0 - f + f / s), measured=t_fla / t_ours,
        flash_kda_calls_per_forward=calls, ours_vs_fla_out_rel=ours_vs_fla,
        dispatch_ok=calls == expected_calls(cfg),
    )
    if verdict:
        row["dispatch_rejected"] = verdict
    return row


def _verdict(torch, cfg, calls, captured):
    """Why the flash-kda calls per forward are not the expected ones (None when they are)."""
    want = expected_calls(cfg)
    if calls == want:
        return None
    if GATES[cfg.get("gate", "safe")]["route"] == "fla-dispatch":
        if calls["flash-kda"] == 0:
            return _why_not_dispatched(torch, captured)
        return f"flash-kda calls per forward {calls}, expected {want}"
    why = []
    if calls["fla"]:
        why.append(f"fla's dispatch sent the {cfg['gate']} gate to flash-kda ({calls['fla']} calls a forward): "
                   "the fla variant is not fla's Triton path")
    if calls["flash-kda"] != want["flash-kda"]:
        why.append(f"flash_kda.chunk_kda ran {calls['flash-kda']} times a forward, expected {want['flash-kda']}")
    if calls["no-op"]:
        why.append(f"the no-op variant called flash-kda {calls['no-op']} times a forward")
    return "; ".join(why)


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
    text = (f"{r['config']:<20s} T={r['tokens']:<6d} L={r['layers']} {'+mlp' if r['mlp'] else 'kda '}  stack fla {r['t_fla_ms']:8.2f} ms  "
            f"flash-kda {r['t_flash_kda_ms']:8.2f} ms  no-op {r['t_noop_ms']:8.2f} ms | f {r['f']:.3f}  "
            f"s {r['s']:.2f}  Amdahl {r['amdahl']:.3f}x  measured {r['measured']:.3f}x")
    if not r["dispatch_ok"]:
        text += (f"  DISPATCH FAILED (flash-kda calls per forward: {r['flash_kda_calls_per_forward']}"
                 f"; {r.get('dispatch_rejected', '')})")
    return text
