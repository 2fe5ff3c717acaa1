"""A cold first run says numba is compiling; a kernel already compiled (or cached) says nothing."""

from __future__ import annotations

import numpy as np
from numba import njit

from zerogr_build.base.compile_notice import on_first_compile


def test_first_compile_is_reported_once_and_warm_calls_are_silent():
    @njit(cache=False)
    def twice(x):
        return x * 2

    @njit(cache=False)
    def thrice(x):
        return x * 3

    seen: list[str] = []
    with on_first_compile(seen.append):
        twice(np.int64(2))  # compiles
        thrice(np.int64(2))  # compiles too, but the notice is one line per run
    assert len(seen) == 1 and "twice" in seen[0]
    seen.clear()
    with on_first_compile(seen.append):
        twice(np.int64(5))  # already compiled for int64: no compile, no notice
    assert seen == []
    twice(np.float64(1.0))  # compiling outside the block reports nothing
    assert seen == []
