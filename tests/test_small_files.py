"""base.small_files: the one reader of small JSON files (plans, SID maps, quality records) and config text.
A FIFO or a device is refused at once, never read; a file over its limit is refused; NaN is not JSON."""

from __future__ import annotations

import os

import pytest

from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.base.small_files import read_small_bytes, read_small_json
from zerogr_build.bundle.quality import load_quality
from zerogr_build.integrations.sid_map import SidMap
from zerogr_build.runtime.plan import load_plan
from zerogr_build.testing import finishes


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        finishes(lambda: read_small_json(fifo, 100, "thing"))
    with pytest.raises(BundleError, match="not a regular file"):
        finishes(lambda: load_plan(fifo))
    with pytest.raises(BundleError, match="not a regular file"):
        finishes(lambda: load_quality(fifo))


def test_a_device_is_refused_unread(tmp_path):
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="not a regular file"):
        finishes(lambda: read_small_bytes(zero, 100, "config file"))
    with pytest.raises(InputError, match="not a regular file"):
        finishes(lambda: SidMap.load(zero))


def test_limit_missing_and_constants(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"[1]  ")
    assert read_small_json(path, 5, "thing") == [1]
    with pytest.raises(InputError, match="thing larger than 4 bytes"):
        read_small_json(path, 4, "thing")
    path.write_bytes(b"[NaN]")
    with pytest.raises(InputError, match="NaN is not JSON"):
        read_small_json(path, 100, "thing")
    with pytest.raises(InputError, match="cannot read thing"):
        read_small_json(tmp_path / "missing.json", 100, "thing")
    with pytest.raises(FileNotFoundError):
        read_small_bytes(tmp_path / "missing.json", 100, "thing")
