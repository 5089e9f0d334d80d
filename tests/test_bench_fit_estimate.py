"""bench/fit_estimate.py's fitting machinery: non-negative least squares (Lawson–Hanson) meets its
optimality conditions, and the relative-error fit recovers known bytes per feature."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pulsar_nack.estimate import predict

# bench/ is a directory of scripts that import each other by name, as `python bench/x.py` lets them.
sys.path.append(str(Path(__file__).resolve().parent.parent / "bench"))

from fit_estimate import fit_linear, nnls


def test_nnls_finds_the_non_negative_optimum() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0, 1, (30, 4))
    truth = np.array([2.0, 0.0, 5.0, 1.0])
    assert nnls(a, a @ truth) == pytest.approx(truth, abs=1e-8)
    # Unconstrained least squares would make the second coefficient negative; NNLS holds it at zero and
    # is optimal there (the gradient points out of the feasible set).
    b = a @ np.array([1.0, -3.0, 2.0, 0.5])
    x = nnls(a, b)
    assert (x >= 0).all() and x[1] == 0
    gradient = a.T @ (b - a @ x)
    assert gradient[1] <= 1e-9 and np.abs(gradient[x > 0]).max() < 1e-8


def test_nnls_meets_the_optimality_conditions_on_random_problems() -> None:
    """Karush-Kuhn-Tucker: x >= 0, the gradient vanishes where x > 0 and points outwards where x = 0."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        # strongly correlated columns (like the features): adding one to the fit can push another below 0
        a = rng.normal(size=(15, 1)) + 0.2 * rng.normal(size=(15, 6))
        b = a @ rng.normal(size=6) + 0.1 * rng.normal(size=15)
        x = nnls(a, b)
        gradient = a.T @ (b - a @ x)
        assert (x >= 0).all(), x
        assert np.abs(gradient[x > 0]).max(initial=0) < 1e-8
        assert gradient[x == 0].max(initial=-1) < 1e-8


def test_fit_linear_recovers_bytes_per_feature() -> None:
    rows = [{"a": float(i), "b": float(i * i % 7), "c": 1.0} for i in range(1, 20)]
    measured = [3 * r["a"] + 40 * r["b"] + 100 for r in rows]
    coefficients = fit_linear(rows, measured, ("a", "b", "c"))
    assert coefficients == pytest.approx({"a": 3.0, "b": 40.0, "c": 100.0}, rel=1e-6)
    assert predict(coefficients, rows[3]) == pytest.approx(measured[3])
