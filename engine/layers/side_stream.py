"""A second CUDA stream per device, for a layer's work that depends on none of the work beside it
(the shared experts beside the routed ones, the cache write beside the query's projections),
used while a CUDA graph is captured: the two become parallel branches of the graph, and a
decode step's small kernels, none of which fills the GPU, overlap.

``with beside(device):`` queues the block on the side stream after everything already queued on
the current stream; ``join(device, *tensors)`` makes the current stream wait for the side stream
and tells the allocator that ``tensors`` (made on the side stream) are used on the current one.
Outside a capture (and off CUDA) both do nothing and the block runs in order: eagerly the host
issues kernels one at a time and is the bottleneck at these sizes, and a fork would add its
event calls and defer the allocator's reuse of the tensors that crossed streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_streams: dict[torch.device, torch.cuda.Stream] = {}


def _side(device: torch.device) -> torch.cuda.Stream:
    """The device's side stream: never the current one (torch hands streams out from a pool in turn,
    so a new one could be the very stream a graph is captured on)."""
    current = torch.cuda.current_stream(device)
    stream = _streams.get(device)
    while stream is None or stream == current:
        stream = _streams[device] = torch.cuda.Stream(device)
    return stream


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def beside(device: torch.device) -> Iterator[None]:
    """Run the block on ``device``'s side stream, after the work queued so far (while capturing)."""
    if not _capturing(device):
        yield
        return
    side = _side(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield


def join(device: torch.device, *tensors: torch.Tensor) -> None:
    """The current stream waits for the side stream; ``tensors`` are marked as used on it (while
    capturing)."""
    if not _capturing(device):
        return
    current = torch.cuda.current_stream(device)
    current.wait_stream(_side(device))
    for tensor in tensors:
        tensor.record_stream(current)
