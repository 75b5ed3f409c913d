"""flash-kda: Kimi Delta Attention (KDA) forward kernels.

    import flash_kda
    flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                  initial_state=None, final_state=None, cu_seqlens=None,
                  *, state_indices=None, has_initial_state=None)   # prefill, optionally on a pool
    flash_kda.decode(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                     state, state_indices, *, num_accepted_tokens=None, cu_seqlens=None)
    o, final_state = flash_kda.chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias,
                                         lower_bound=-5.0, ...)      # torch tensors

``fwd`` has FlashKDA's signature: it writes ``out`` (and ``final_state``) in place and returns None.
It accepts NumPy arrays (bf16 as ``ml_dtypes.bfloat16``) and torch tensors, on the host or on a CUDA
device; see ``help(flash_kda.fwd)``. ``decode`` is the serving decode step (1 to 8 tokens per
sequence) on a state pool ``[P, HV, V, K]`` updated in place through int32 slot indices
(``help(flash_kda.decode)``, docs/serving.md). ``chunk_kda`` has flash-linear-attention's ``chunk_kda``
interface and allocates its outputs (torch only). ``reference`` is the float64 NumPy recurrence used
to measure errors; ``python -m flash_kda`` runs a benchmark with an error check.

This package imports torch only when asked to: ``flash_kda.torch_ops`` (the custom operators
``torch.ops.flash_kda.fwd`` / ``.decode`` / ``.chunk_kda`` and ``chunk_kda``) is loaded at import
when torch is already imported, else on first use (docs/torch.md).
"""

import sys as _sys
from importlib import import_module as _import_module

from ._C import built_with_cuda, cuda_available
from ._decode import decode
from ._fwd import fwd
from ._reference import reference

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("flash-kda")
except PackageNotFoundError:  # imported from a source tree that was not installed
    __version__ = "0+unknown"

# chunk_kda is not listed: `from flash_kda import *` must work without torch.
__all__ = ["fwd", "decode", "reference", "cuda_available", "built_with_cuda", "__version__"]


def __getattr__(name):
    """chunk_kda and torch_ops load flash_kda.torch_ops (importing torch) on first access."""
    if name in ("chunk_kda", "torch_ops"):
        try:
            torch_ops = _import_module(__name__ + ".torch_ops")  # sets the attribute torch_ops
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            # AttributeError (not ImportError): hasattr(flash_kda, "chunk_kda") is False without torch
            raise AttributeError(f"flash_kda.{name} needs PyTorch, which is not installed") from e
        globals()["chunk_kda"] = torch_ops.chunk_kda
        return globals()[name]
    raise AttributeError(f"module 'flash_kda' has no attribute {name!r}")


if _sys.modules.get("torch") is not None:  # torch is in use already: register the operators now
    chunk_kda = _import_module(__name__ + ".torch_ops").chunk_kda
