"""The eager calls: one call into flash_kda._C per fwd / decode, which converts the arrays and has
the C++ contract layer check every argument before anything is written. Used by flash_kda.fwd /
flash_kda.decode and by the implementations of the torch operators (flash_kda.torch_ops).

CUDA tensors run on the current stream of their device (whichever device is current). A device
cu_seqlens is copied to the host (a synchronisation) for the C++ layer to check its contents,
unless a host copy is given (cu_seqlens_cpu) or the stream is capturing a CUDA graph (the contents
are then the caller's responsibility).
"""

from __future__ import annotations

from . import _C
from ._arrays import DECODE_NAMES, FWD_NAMES, backend_name, export, torch_module


class _Cuda:
    """The torch CUDA calls of the eager route, looked up once (private bindings that return plain
    ints and bools cost a few hundred ns, the public spellings microseconds)."""

    def __init__(self, torch):
        c = torch._C
        self.torch = torch
        self.stream = getattr(c, "_cuda_getCurrentRawStream", None) or (
            lambda d: torch.cuda.current_stream(d).cuda_stream)
        self.capturing = (getattr(c, "_cuda_isCurrentStreamCapturing", None)
                          or torch.cuda.is_current_stream_capturing)
        self.to_dlpack = c._to_dlpack
        self.uint8 = torch.uint8

    def host_copy(self, cu_seqlens, cu_seqlens_cpu):
        """The host copy of a device cu_seqlens the C++ layer checks, or None."""
        if cu_seqlens_cpu is not None or cu_seqlens is None:
            return cu_seqlens_cpu
        if not isinstance(cu_seqlens, self.torch.Tensor) or not cu_seqlens.is_cuda or self.capturing():
            return None
        return cu_seqlens.cpu()

    def allocator(self, device):
        # From torch's caching allocator: stream-ordered, and usable under CUDA-graph capture.
        return lambda nbytes: self.to_dlpack(self.torch.empty(nbytes, dtype=self.uint8, device=device))


_cuda = None


def _cuda_route(q):
    """The _Cuda helper when q is a CUDA tensor, else None."""
    global _cuda
    torch = torch_module()
    if torch is None or not isinstance(q, torch.Tensor) or not q.is_cuda:
        return None
    if _cuda is None:
        _cuda = _Cuda(torch)
    return _cuda


def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
        cu_seqlens=None, cu_seqlens_cpu=None, state_indices=None, has_initial_state=None, backend=None,
        checkpoint_interval=None, checkpoint_state=None, checkpoint_indices=None, checkpoint_start=None,
        allow_neg_eigval=False):
    cuda = _cuda_route(q)
    stream, allocate = 0, None
    if cuda is not None:
        cu_seqlens_cpu = cuda.host_copy(cu_seqlens, cu_seqlens_cpu)
        stream = cuda.stream(q.get_device())
        allocate = cuda.allocator(q.device)
    arrays, bf16_bits, read_only = export(FWD_NAMES, (
        q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, cu_seqlens_cpu, initial_state, final_state,
        state_indices, has_initial_state, checkpoint_state, checkpoint_indices, checkpoint_start))
    a = arrays
    _C.fwd(a[0], a[1], a[2], a[3], a[4], scale, a[5], a[6], a[7], lower_bound, a[10], a[11], a[8], a[9],
           a[12], a[13], a[14], a[15], a[16], checkpoint_interval=checkpoint_interval,
           backend=backend_name(backend), stream=stream, bf16_bits=bf16_bits, read_only=read_only,
           allocate=allocate, allow_neg_eigval=bool(allow_neg_eigval))


def decode(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, state, state_indices,
           num_accepted_tokens=None, cu_seqlens=None, backend=None, allow_neg_eigval=False):
    cuda = _cuda_route(q)
    stream, cu_seqlens_cpu = 0, None
    if cuda is not None:
        cu_seqlens_cpu = cuda.host_copy(cu_seqlens, None)
        stream = cuda.stream(q.get_device())
    a, bf16_bits, read_only = export(DECODE_NAMES, (
        q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, cu_seqlens_cpu, state, None, state_indices,
        num_accepted_tokens))
    _C.decode(a[0], a[1], a[2], a[3], a[4], scale, a[5], a[6], a[7], lower_bound, a[10], a[12], a[13],
              a[8], a[9], backend=backend_name(backend), stream=stream, bf16_bits=bf16_bits,
              read_only=read_only, allow_neg_eigval=bool(allow_neg_eigval))
