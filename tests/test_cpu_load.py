"""free_cores: the cores a parallel kernel call may use right now, from the kernel's runnable count."""

from __future__ import annotations

import pytest

from zerogr_build.base import cpu_load as _cpu_load


def loadavg(tmp_path, running: int, total: int = 400) -> str:
    path = tmp_path / "loadavg"
    path.write_text(f"1.50 1.20 0.90 {running}/{total} 4242\n")
    return str(path)


@pytest.mark.parametrize(("cores", "running", "expect"), [(2, 1, 2), (2, 2, 1), (2, 3, 1), (16, 5, 12),
                                                          (16, 40, 1), (4, 0, 4)])  # fmt: skip
def test_free_cores_leaves_out_the_other_runnable_threads(tmp_path, monkeypatch, cores, running, expect):
    monkeypatch.setattr(_cpu_load, "machine_cores", lambda: cores)
    monkeypatch.setattr(_cpu_load, "usable_cores", lambda: cores)
    assert _cpu_load.free_cores(loadavg(tmp_path, running), tasks(tmp_path, "R")) == expect


def tasks(tmp_path, *states: str) -> str:
    """A fake /proc/self/task with one thread per state ("R" running, "S" sleeping)."""
    root = tmp_path / "task"
    for i, state in enumerate(states):
        (root / str(100 + i)).mkdir(parents=True)
        (root / str(100 + i) / "stat").write_text(f"{100 + i} (python (x) y) {state} 1 2 3\n")
    return str(root)


def test_this_process_running_threads_are_not_counted_against_it(tmp_path, monkeypatch):
    """The caller and this process's pool threads still spinning after a parallel region are its own."""
    monkeypatch.setattr(_cpu_load, "machine_cores", lambda: 4)
    monkeypatch.setattr(_cpu_load, "usable_cores", lambda: 4)
    mine = tasks(tmp_path, "R", "R", "S", "R")
    assert _cpu_load.own_runnable_threads(mine) == 3
    assert _cpu_load.free_cores(loadavg(tmp_path, 3), mine) == 4  # only this process runs
    assert _cpu_load.free_cores(loadavg(tmp_path, 5), mine) == 2  # two threads of others
    assert _cpu_load.own_runnable_threads(str(tmp_path / "missing")) == 1


def test_free_cores_never_exceeds_the_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(_cpu_load, "machine_cores", lambda: 64)
    monkeypatch.setattr(_cpu_load, "usable_cores", lambda: 4)
    assert _cpu_load.free_cores(loadavg(tmp_path, 1), tasks(tmp_path, "R")) == 4


@pytest.mark.parametrize("text", ["", "garbage", "1 2 3 x/y 5"])
def test_unreadable_counts_leave_every_usable_core(tmp_path, monkeypatch, text):
    monkeypatch.setattr(_cpu_load, "usable_cores", lambda: 3)
    path = tmp_path / "loadavg"
    path.write_text(text)
    assert _cpu_load.free_cores(str(path)) == 3
    assert _cpu_load.free_cores(str(tmp_path / "missing")) == 3


def test_kernel_threads_follow_the_free_cores(monkeypatch):
    """The numba kernel takes torch's thread count, but no more than the cores free at the call."""
    torch = pytest.importorskip("torch")
    numba = pytest.importorskip("numba")
    from zerogr_build.runtime.scoring import selective_numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(selective_numba, "free_cores", lambda: 1)
        assert selective_numba.set_kernel_threads(selective_numba.PARALLEL_MIN_WORK) == 1
        monkeypatch.setattr(selective_numba, "free_cores", lambda: 2)
        assert selective_numba.set_kernel_threads(selective_numba.PARALLEL_MIN_WORK) == 2
        assert selective_numba.set_kernel_threads(1) == 1  # small calls stay on the calling thread
    finally:
        torch.set_num_threads(previous)
