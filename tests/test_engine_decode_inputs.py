"""The staging buffers of a decode step: typed views of one layout, padding rows, one copy."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.decode_inputs import DecodeInputs
from engine.native.python_ops import pack_decode
from engine.sequence import Sequence


def _seqs() -> list[Sequence]:
    a = Sequence(0, [5, 6, 7, 8, 9], SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=11), seed=11)
    a.block_table = [4, 2]
    b = Sequence(1, [1, 2], SamplingParams(), seed=99)
    b.block_table = [7]
    b.append(3, -0.5, 1.0)
    return [a, b]


def test_stage_fills_rows_pads_the_rest_and_reaches_the_device_views():
    """On CPU the copies to the device side are immediate; the copy to a GPU is exercised by the
    GPU test that samples inside the decode graph (tests/test_engine_sampling.py)."""
    inputs = DecodeInputs(max_batch=8, width=3, device=torch.device("cpu"))
    assert inputs.on_device.slots.tolist() == [-1] * 8  # before any step: rows that write nothing
    seqs = _seqs()
    packed = pack_decode([s.last_token for s in seqs], [len(s) for s in seqs], [s.block_table for s in seqs], 4, 3)
    inputs.stage(seqs, packed, rows=4)
    x = inputs.on_device
    assert x.input_ids[:4].tolist() == [9, 3, 0, 0] and x.positions[:4].tolist() == [4, 2, 0, 0]
    assert x.slots[:4].tolist() == [2 * 4 + 0, 7 * 4 + 2, -1, -1] and x.context_lens[:4].tolist() == [5, 3, 0, 0]
    assert x.block_tables[:2].tolist() == [[4, 2, 0], [7, 0, 0]]
    assert x.temperature[:4].tolist() == [0.5, 0.0, 0.0, 0.0] and x.top_p[:4].tolist() == pytest.approx([0.9, 1.0, 1.0, 1.0])
    assert x.top_k[:4].tolist() == [3, 0, 0, 0] and x.seed[:4].tolist() == [11, 99, 0, 0] and x.step[:4].tolist() == [0, 1, 0, 0]
    # Fields do not overlap: each view owns its own bytes of the one buffer.
    starts = sorted(getattr(x, f).data_ptr() for f in ("input_ids", "positions", "slots", "top_k", "seed", "step",
                                                        "token_rows", "temperature", "top_p", "context_lens"))
    assert len(set(starts)) == 10 and inputs.sampled.data_ptr() not in starts
    assert inputs.input_ids(4).tolist() == [9, 3, 0, 0]  # each row its own staged token


def test_stage_refuses_more_sequences_than_rows():
    inputs = DecodeInputs(max_batch=2, width=3, device=torch.device("cpu"))
    seqs = _seqs()
    packed = pack_decode([s.last_token for s in seqs], [len(s) for s in seqs], [s.block_table for s in seqs], 4, 3)
    with pytest.raises(ValueError, match="2 sequences in 1 rows"):
        inputs.stage(seqs, packed, rows=1)
