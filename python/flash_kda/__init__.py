"""flash-kda: Kimi Delta Attention (KDA) forward kernels.

    import flash_kda
    flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                  initial_state=None, final_state=None, cu_seqlens=None)

``fwd`` has FlashKDA's signature: it writes ``out`` (and ``final_state``) in place and returns None.
It accepts NumPy arrays (bf16 as ``ml_dtypes.bfloat16``) and torch tensors, on the host or on a CUDA
device; see ``help(flash_kda.fwd)``. ``reference`` is the float64 NumPy recurrence used to measure
errors; ``python -m flash_kda`` runs a benchmark with an error check.
"""

from ._C import built_with_cuda, cuda_available
from ._fwd import fwd
from ._reference import reference

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("flash-kda")
except PackageNotFoundError:  # imported from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = ["fwd", "reference", "cuda_available", "built_with_cuda", "__version__"]
