"""D9: tune's kernel gate checks what gets served, not one shape: a kernel wrong only on the two-pass path
(small R, wide K), only for a d that is not a multiple of 8 in a padded view, or only above the 48 KB
shared-memory opt-in is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zerogr_build.base import selective_torch
from zerogr_build.tune.check import check_mode_against_reference


def _broken_when(condition):
    """The torch reference, except that its output is off by 1 where condition(hidden, weight, tokens)."""

    def wrap(fn):
        def run(hidden, weight, bias, tokens):
            out = fn(hidden, weight, bias, tokens)
            return out + 1.0 if condition(hidden, weight, tokens) else out

        return run

    return SimpleNamespace(
        selective_scores=wrap(selective_torch.selective_scores),
        selective_log_softmax=wrap(selective_torch.selective_log_softmax),
    )


REFERENCE = SimpleNamespace(
    selective_scores=selective_torch.selective_scores,
    selective_log_softmax=selective_torch.selective_log_softmax,
)


def _check(mode) -> str | None:
    return check_mode_against_reference(mode, REFERENCE, "cpu", "fp32", vocab=300, hidden_dim=128)


def test_the_reference_passes_every_gate_case():
    assert _check(REFERENCE) is None


@pytest.mark.parametrize(
    ("name", "condition", "where"),
    [
        ("two-pass", lambda h, w, t: t.shape[0] < 8 and t.shape[1] > 64, "R=4, K=200"),
        ("tail", lambda h, w, t: h.shape[1] % 8 != 0, "d=70, padded rows"),
        ("padded view", lambda h, w, t: w.stride(0) != w.shape[1], "d=70, padded rows"),
        ("opt-in", lambda h, w, t: 4 * h.shape[1] > 48 * 1024, "d=13000"),
    ],
)
def test_a_kernel_wrong_on_one_served_shape_is_refused(name, condition, where):
    problem = _check(_broken_when(condition))
    assert problem is not None and where in problem, (name, problem)
