"""``engine.layers.side_stream``: outside a CUDA-graph capture (and off CUDA) the block runs in order
on the caller's stream; while a graph is captured it runs on another stream after the work queued
before it, and the caller's stream waits for it at ``join``."""

from __future__ import annotations

import pytest
import torch

from engine.layers.side_stream import beside, join


def test_outside_a_capture_the_block_runs_in_place_in_order():
    x = torch.arange(4.0)
    with beside(x.device):
        y = x * 2
    join(x.device, y)
    assert torch.equal(y + x, torch.tensor([0.0, 3.0, 6.0, 9.0]))


@pytest.mark.gpu
def test_in_a_captured_graph_the_block_is_a_branch_after_the_queued_work_and_is_joined():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    device = torch.device("cuda")
    x = torch.zeros(1 << 22, device=device)
    caller = torch.cuda.current_stream(device)
    with beside(device):  # eagerly: the caller's own stream
        assert torch.cuda.current_stream(device) == caller
        eager = x + 1
    assert torch.equal(eager, torch.ones_like(x))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream(device)
        x.fill_(1.0)  # queued before the block: the branch must see it
        with beside(device):
            assert torch.cuda.current_stream(device) != main
            y = x * 3
        assert torch.cuda.current_stream(device) == main
        z = x * 5  # beside the branch
        join(device, y)
        total = y + z
    for _ in range(3):
        x.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert float(total.sum()) == 8.0 * x.numel()
