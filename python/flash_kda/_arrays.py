"""Shared by the eager calls and the torch operators: how NumPy arrays and torch tensors are handed
to flash_kda._C (DLPack) or described without data (torch's fake tensors). No argument is checked
here; flash_kda._C passes everything to the C++ contract layer (src/api), which checks it all.

The positions below are the bit positions of _C's ``bf16_bits`` / ``read_only`` masks.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

MAX_DECODE_TOKENS = 8  # flash_kda::kMaxDecodeTokens

# Bit positions of the arrays (python/src/binding.cpp, enum Position). decode's state,
# state_indices and num_accepted_tokens take the positions of initial_state, state_indices and
# has_initial_state.
FWD_NAMES = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "cu_seqlens", "cu_seqlens_cpu",
             "initial_state", "final_state", "state_indices", "has_initial_state", "checkpoint_state",
             "checkpoint_indices", "checkpoint_start")
DECODE_NAMES = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "cu_seqlens", "cu_seqlens_cpu",
                "state", None, "state_indices", "num_accepted_tokens")

_BF16 = np.dtype(ml_dtypes.bfloat16)
_UINT16 = np.dtype(np.uint16)


def torch_module():
    """torch, if the caller has imported it (this package never imports it itself outside
    flash_kda.torch_ops)."""
    return sys.modules.get("torch")


def backend_name(backend):
    """_C's spelling of fwd's `backend` (None: where the tensors live); other values go to the C++
    layer as they are, which rejects them by name."""
    return "auto" if backend is None else backend if isinstance(backend, str) else repr(backend)


def _export_one(name, a, bit):
    """(the object _C converts, bf16 bit, read-only bit) for one argument."""
    if a is None:
        return None, 0, 0
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


def export(names, arrays):
    """The arrays as _C takes them, with the bf16_bits and read_only masks. Plain torch tensors
    take the short way (the eager route's per-call cost on CUDA is mostly this loop)."""
    torch = torch_module()
    tensor = torch.Tensor if torch is not None else None
    to_dlpack = torch._C._to_dlpack if torch is not None else None
    out, bf16_bits, read_only = [], 0, 0
    for i, a in enumerate(arrays):
        if a is None:
            out.append(None)
            continue
        if type(a) is tensor and not a.is_neg():
            try:
                out.append(to_dlpack(a))
                continue
            except Exception:  # a tensor DLPack cannot describe: _export_one names it
                pass
        x, b, r = _export_one(names[i], a, 1 << i)
        out.append(x)
        bf16_bits |= b
        read_only |= r
    return out, bf16_bits, read_only


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
