"""Arrays and streams for the CUDA kernels: numba device arrays, numpy arrays, or torch CUDA tensors.

torch is never imported here: a torch tensor can only be passed in once torch
is already loaded, so ``sys.modules`` tells whether an argument is one.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
from numba import cuda


def _torch_cuda_tensor(array: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(array, torch.Tensor) and array.is_cuda


def device_array(array: Any) -> Any:
    """What a kernel launch accepts: numba device arrays and numpy arrays as they are,
    anything else with ``__cuda_array_interface__`` (torch CUDA tensors) wrapped without a copy,
    a torch bfloat16 tensor as its bits (``int16``).

    The wrap does not synchronise the producer's stream: the kernels run on that
    same stream (see :class:`LaunchContext`), which already orders them after it.
    """
    if isinstance(array, np.ndarray) or hasattr(array, "copy_to_host"):
        return array
    if _torch_cuda_tensor(array) and array.dtype == sys.modules["torch"].bfloat16:
        array = array.view(sys.modules["torch"].int16)  # numba has no bfloat16: the kernels read its bits
    return cuda.as_cuda_array(array, sync=False)


class LaunchContext:
    """The stream to launch on, and where scratch memory comes from, for one call.

    Given torch tensors, kernels go on torch's current stream (ordered after
    the torch ops that produced the inputs, no host sync) and scratch comes
    from torch's caching allocator; otherwise the default stream and numba.
    numba launches into the current device's context, so torch tensors must
    live on torch's current device (``with torch.cuda.device(...)``).
    """

    def __init__(self, *arrays: Any) -> None:
        self._torch_like = next((a for a in arrays if _torch_cuda_tensor(a)), None)
        if self._torch_like is not None:
            import torch

            device, current = self._torch_like.device, torch.cuda.current_device()
            if device.index != current:
                raise ValueError(
                    f"the tensors are on {device} but the current CUDA device is cuda:{current};"
                    f" launch under torch.cuda.device({device})"
                )
            self.stream = cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)
        else:
            self.stream = 0

    def empty(self, shape: tuple[int, ...]) -> Any:
        """An uninitialised float32 device array."""
        if self._torch_like is not None:
            import torch

            return cuda.as_cuda_array(
                torch.empty(shape, dtype=torch.float32, device=self._torch_like.device), sync=False
            )
        return cuda.device_array(shape, dtype=np.float32, stream=self.stream)


def configured(kernel, grid, block: int, stream):
    """``kernel[grid, block, stream]`` without numba's warning that a grid of fewer than 128 blocks
    under-uses the GPU: small grids are these kernels' at small batches (a batch-1 decode of a short
    context is a few blocks; a norm is a block per token)."""
    with warnings.catch_warnings():  # numba wraps the message in terminal colour codes: match anywhere
        warnings.filterwarnings(
            "ignore", message=".*Grid size .* low occupancy"
        )  # numba-cuda's own warning class, not numba's
        return kernel[grid, block, stream]
