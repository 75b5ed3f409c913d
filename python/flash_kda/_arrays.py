"""Shared by the eager calls and the torch operators: how arrays that flash_kda._C does not read
directly are handed to it (DLPack), and how tensors are described without data (torch's fake
tensors). No argument is checked here; flash_kda._C passes everything to the C++ contract layer
(src/api), which checks it all.

flash_kda._C reads a torch tensor itself when its type has torch.Tensor's DLPack C exchange API and
the tensor has no negative bit (no Python object per tensor); every other argument (NumPy arrays,
tensors with the negative bit, tensors DLPack cannot describe, types with their own exchange API,
torch without it, non-arrays) comes through ``export_one`` (docs/torch.md, "Host overhead").
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

MAX_DECODE_TOKENS = 8  # flash_kda::kMaxDecodeTokens

_BF16 = np.dtype(ml_dtypes.bfloat16)
_UINT16 = np.dtype(np.uint16)


def torch_module():
    """torch, if the caller has imported it (this package never imports it itself outside
    flash_kda.torch_ops)."""
    return sys.modules.get("torch")


def export_one(name, a, bit):
    """(the object _C converts, bf16 bit, read-only bit) for one argument that is not None: what
    flash_kda._C calls for the arrays it does not read itself."""
    if type(a) is np.ndarray:
        read_only = 0 if a.flags.writeable else bit
        if a.dtype == _BF16:  # DLPack cannot carry ml_dtypes' bfloat16: its bits as uint16
            return a.view(_UINT16), bit, read_only
        return a, 0, read_only
    torch = torch_module()
    if torch is not None and isinstance(a, torch.Tensor):
        # DLPack does not carry torch's negative bit (torch._neg_view): resolve it on inputs (a
        # copy); an output so marked cannot be written in place. (The conjugate bit exists on
        # complex tensors only, whose dtype the C++ layer rejects.)
        if a.is_neg():
            if name in ("out", "final_state", "state", "checkpoint_state"):
                raise ValueError(f"{name}: a tensor with the negative bit set (a lazy view) cannot be "
                                 "written in place; pass a resolved tensor")
            a = a.resolve_neg()
        # to_dlpack exports without stream synchronisation (Tensor.__dlpack__() without a stream
        # would make the default stream wait on the current one, which is not allowed while
        # capturing a CUDA graph); the kernels run on the current stream anyway.
        try:
            return torch._C._to_dlpack(a), 0, 0
        except (BufferError, RuntimeError) as e:  # a tensor DLPack cannot describe (meta, sparse, ...)
            raise ValueError(f"{name}: cannot be passed as an array ({e}; on device {a.device})") from None
    raise TypeError(f"{name}: expected a NumPy array or a torch tensor (got {type(a).__name__})")


def describe(a):
    """A tensor without data, as _C.check_fwd / check_decode take it (fake and meta tensors)."""
    if a is None:
        return None
    torch = torch_module()
    if torch is None or not isinstance(a, torch.Tensor):
        if isinstance(a, np.ndarray):
            dtype = "bfloat16" if a.dtype == _BF16 else str(a.dtype)
            return (dtype, tuple(a.shape), tuple(s // a.itemsize for s in a.strides), "cpu", 0)
        return ("not-a-tensor:" + type(a).__name__, (), (), "cpu", 0)
    return (str(a.dtype).replace("torch.", ""), tuple(a.shape), tuple(a.stride()), a.device.type,
            a.device.index or 0)
