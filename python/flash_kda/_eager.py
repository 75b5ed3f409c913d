"""The host side of the eager calls: what flash_kda.fwd / flash_kda.decode, chunk_kda and the
implementations of the torch operators (flash_kda.torch_ops) need around their one call into
flash_kda._C, which reads the arrays and has the C++ contract layer check every argument before
anything is written. Each of them makes that call itself (one Python call less per call).

Nothing here runs per call on the common route: flash_kda._C reads plain torch tensors and the
current CUDA stream itself (torch's DLPack C exchange API) and calls back into this module only
when it needs to: ``workspace`` when a CUDA call needs scratch memory, ``current_stream`` for torch
without that API (docs/torch.md, "Host overhead").

CUDA tensors run on the current stream of their device (whichever device is current). A device
cu_seqlens is copied to the host (``host_copy``, a synchronisation) for the C++ layer to check its
contents, unless a host copy is given (cu_seqlens_cpu) or the stream is capturing a CUDA graph (the
contents are then the caller's responsibility).
"""

from __future__ import annotations

import sys

from . import _C


def host_copy(q, cu_seqlens):
    """The host copy of a CUDA cu_seqlens (with CUDA q) for the C++ layer to check, or None (not a
    CUDA tensor, or the current stream is capturing a CUDA graph)."""
    torch = sys.modules.get("torch")
    if (torch is None or not isinstance(q, torch.Tensor) or not q.is_cuda
            or not isinstance(cu_seqlens, torch.Tensor) or not cu_seqlens.is_cuda):
        return None
    capturing = (getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
                 or torch.cuda.is_current_stream_capturing)
    return None if capturing() else cu_seqlens.cpu()


def current_stream(device):
    """torch's current stream of CUDA device `device` as an integer (0 without torch); _C asks only
    when torch has no DLPack C exchange API."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def workspace(nbytes, device):
    """Scratch memory of `nbytes` on CUDA device `device`, as a DLPack capsule, from torch's caching
    allocator (stream-ordered, usable under CUDA-graph capture); None without torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return torch._C._to_dlpack(torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device)))

