"""FlashKDA (MoonshotAI/FlashKDA, the CUTLASS library) timed beside flash-kda on the same inputs.

FlashKDA is not a dependency: the speed suite times it when its compiled extension, the module
``flash_kda_C``, is importable (it links against torch, so torch is imported first). Build or
install FlashKDA for your GPU and torch, or put a folder holding its ``flash_kda_C*.so`` on
PYTHONPATH; ``--flashkda none`` leaves it out. Its forward has flash_kda.fwd's shapes and meaning
(V-first states, fp32 or bf16; an fp32 state is rounded to bf16 inside), takes ``dt_bias`` as
``[H, K]``, int64 ``cu_seqlens`` and K = V = 128 only, and needs a caller-owned workspace of
``get_workspace_size(B * T, H, N)`` bytes.
"""

from __future__ import annotations

import importlib

from . import cases as C

MODULE = "flash_kda_C"
SCALE, LOWER_BOUND = C.SCALE, C.LOWER_BOUND


def load():
    """(FlashKDA's extension module, None), or (None, why it cannot be imported)."""
    try:
        import torch  # noqa: F401  (the extension needs torch's libraries loaded first)
    except ImportError:
        return None, "torch is not installed"
    try:
        return importlib.import_module(MODULE), None
    except ImportError as e:  # not on the path, or built for another torch / Python
        return None, f"{type(e).__name__}: {e}"


def make_call(fk, torch, x, case):
    """FlashKDA's forward on the speed suite's inputs `x` of `case` (q, k, v, g, beta, A_log,
    dt_bias flat [H * K], h0, cu) into its own out and final state, with its workspace allocated
    here. Returns (call, out, final_state); `call()` launches one forward on the current stream."""
    B, T, N, _ = C.expand(case)
    H = case["H"]
    ws = torch.empty(int(fk.get_workspace_size(B * T, H, N)), dtype=torch.uint8, device=x["q"].device)
    out = torch.empty_like(x["out"])
    final_state = torch.empty_like(x["ht"])
    dt_bias = x["dt_bias"].reshape(H, C.K)
    cu = x["cu"]
    if cu is not None and cu.dtype != torch.int64:
        cu = cu.to(torch.int64)

    def call():
        fk.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], SCALE, out, ws, x["A_log"], dt_bias, LOWER_BOUND,
               initial_state=x["h0"], final_state=final_state, cu_seqlens=cu)

    return call, out, final_state
