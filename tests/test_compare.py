"""bringup_kernels.compare: exact outputs bit for bit, others within tolerance over finite values, and
inf/NaN only where both sides carry the same bits."""

from __future__ import annotations

import pytest
import torch

from bringup_kernels.compare import CLOSE, DIFFERS, EQUAL, compare

INF, NAN = float("inf"), float("nan")


def _randn(seed: int, n: int = 64) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_bitwise_equal_close_and_beyond_tolerance():
    ref = _randn(1)
    assert compare("y", ref.clone(), ref, exact=False).status == EQUAL
    nudged = ref.clone()
    nudged[3] += 1e-6 * float(ref.abs().max())
    close = compare("y", nudged, ref, exact=False)
    assert close.status == CLOSE and close.n_diff == 1 and close.first_diff == [3]
    assert compare("y", nudged, ref, exact=True).status == DIFFERS  # exact outputs allow no nudge
    far = ref.clone()
    far[5] += 0.1 * float(ref.abs().max())
    assert compare("y", far, ref, exact=False).status == DIFFERS


@pytest.mark.parametrize("out, ref, status", [
    ([100.0, -50.0, -3.0], [1.0, 2.0, -INF], DIFFERS),  # an inf in the reference must not widen the tolerance
    ([1.0, 2.0, -INF], [1.0, 2.0, -INF], EQUAL),
    ([1.0, 2.0 + 1e-6, -INF], [1.0, 2.0, -INF], CLOSE),  # equal infinities, finite parts within tolerance
    ([1.0, 2.0, INF], [1.0, 2.0, -INF], DIFFERS),
    ([1.0, 2.0, NAN], [1.0, 2.1, 3.0], DIFFERS),
    ([1.0, 2.0 + 1e-6, NAN], [1.0, 2.0, 3.0], DIFFERS),  # NaN never passes against a number
])
def test_non_finite_values_need_the_same_bits(out, ref, status):
    assert compare("y", torch.tensor(out), torch.tensor(ref), exact=False).status == status


def test_bf16_ulp_distance_is_reported():
    ref = _randn(2).to(torch.bfloat16)
    bits = ref.view(torch.int16).clone()
    bits[7] += 2  # two representable steps away (same sign, no exponent wrap for these values)
    out = bits.view(torch.bfloat16)
    result = compare("y", out, ref, exact=False)
    assert result.ulp == 2 and result.n_diff == 1


def test_shape_or_dtype_mismatch_differs():
    ref = _randn(3)
    assert compare("y", ref[:-1], ref, exact=False).status == DIFFERS
    assert compare("y", ref.double(), ref, exact=False).status == DIFFERS
