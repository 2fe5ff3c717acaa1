"""plan="auto" without a plan to follow: the warning (and Decoder.plan_fallback, and the follower's log line)
names what did not match - the CPU thread count, the device type, the dtype - and what the decoder does
instead, on bundles tuned for real (`tune_bundle`) or holding another device's plan file."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from zerogr_build.bundle import add_bundle_files, open_bundle, publish_bundle
from zerogr_build.config import TuneSettings
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.plan import HEURISTIC_FALLBACK
from zerogr_build.runtime.serving.follow import follow
from zerogr_build.tune import tune_bundle

SIZES = (16, 64)
SETTINGS = TuneSettings(batch_sizes=(1,), beam_width=4, hidden_dim=8, warmup=0, iters=1)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def publish(out: Path) -> Path:
    rng = np.random.default_rng(3)
    sids = np.stack([rng.integers(0, v, 500) for v in SIZES], axis=1)
    index = build_index(sids, SIZES, step_formats="0=dense,1=sparse")
    return publish_bundle(index, pa.array(np.arange(500, dtype=np.int64)), out).path


def weights(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(v, SETTINGS.hidden_dim, generator=gen).to(dtype) for v in SIZES]


@pytest.fixture(scope="module")
def tuned_at_2_threads(tmp_path_factory) -> Path:
    vdir = publish(tmp_path_factory.mktemp("out"))
    with torch_threads(2):
        tune_bundle(vdir, "cpu", SETTINGS)
    return vdir


def auto_decoder(vdir: Path, dtype: torch.dtype = torch.float32) -> tuple[Decoder, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = Decoder(open_bundle(vdir), weights(dtype), plan="auto")
    return dec, [str(w.message) for w in caught]


def test_a_plan_of_the_same_cpu_at_its_thread_count_is_followed_without_a_word(tuned_at_2_threads):
    with torch_threads(2):
        dec, said = auto_decoder(tuned_at_2_threads)
    assert dec.plan is not None and dec.plan_fallback is None
    assert not [m for m in said if "plan" in m], said


def test_a_plan_tuned_at_2_threads_in_a_1_thread_process_names_the_thread_counts(tuned_at_2_threads):
    with torch_threads(1):
        dec, said = auto_decoder(tuned_at_2_threads)
    assert dec.plan is None
    (message,) = [m for m in said if "plan='auto'" in m]
    assert message == dec.plan_fallback
    assert "measured with 2 CPU threads, this process computes with 1" in message
    assert "torch.set_num_threads(2)" in message and "-1t)" in message and "-2t:" in message
    assert message.endswith(f"; using {HEURISTIC_FALLBACK}")


def _write_plan(vdir: Path, key: str, device: object, entries: list[dict]) -> None:
    plan = {"format": "zerogr-plan", "format_version": 1, "device_key": key, "device": device,
            "entries": entries}  # fmt: skip
    add_bundle_files(vdir, {f"plans/{key}.json": json.dumps(plan).encode()})


def test_a_gpu_plan_on_a_cpu_names_both_device_types(tmp_path):
    vdir = publish(tmp_path)
    gpu = {"type": "cuda", "name": "NVIDIA H200", "arch": "sm_90", "compute_capability": "9.0"}
    _write_plan(vdir, "cuda-nvidia-h200-sm90", gpu, [{"step": 1, "batch_size": 1, "dtype": "bf16",
                                                     "mode": "selective_cuda"}])  # fmt: skip
    dec, said = auto_decoder(vdir)
    assert dec.plan is None
    assert "cuda-nvidia-h200-sm90: measured on cuda (NVIDIA H200), this process runs on cpu" in said[0]


def test_a_plan_without_the_weights_dtype_names_the_dtypes_it_measured(tuned_at_2_threads):
    with torch_threads(2):
        dec, said = auto_decoder(tuned_at_2_threads, torch.bfloat16)
        assert dec.plan is not None and dec.plan_fallback is None  # the device matched
        gen = torch.Generator().manual_seed(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dec.search(
                lambda t, prefixes, batch: torch.randn(len(batch), SETTINGS.hidden_dim, generator=gen).to(
                    torch.bfloat16
                ),
                1,
                4,
            )
    said = [str(w.message) for w in caught]
    assert any(
        "the plan has no entry for step 1 at bf16: it measured fp32 (the weights are bf16; tune with "
        "--dtypes bf16); using the heuristic mode choice for step 1" in m
        for m in said
    ), said


def test_a_hostile_device_record_is_quoted_escaped_and_short(tmp_path):
    vdir = publish(tmp_path)
    cpu = {"type": "cpu", "name": "\x1b[31mevil" + "x" * 500, "arch": "x86_64", "threads": 64}
    _write_plan(vdir, "cpu-x86-64-evil-64t", cpu, [])
    dec, said = auto_decoder(vdir)
    assert "\x1b" not in dec.plan_fallback and "x" * 100 not in dec.plan_fallback
    assert "model \\x1b[31mevil" in dec.plan_fallback


def test_the_follower_logs_the_fallback_of_the_version_it_serves(tuned_at_2_threads, caplog):
    caplog.set_level(logging.WARNING, logger="zerogr_build.follow")
    with torch_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        follower = follow(tuned_at_2_threads.parent, weights(), timeout=60)
        try:
            assert follower.decoder.plan_fallback is not None
        finally:
            follower.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "zerogr_build.follow"]
    want = f"zerogr follow: {tuned_at_2_threads.name}: plan='auto': no plan for this device"
    assert any(line.startswith(want) and "measured with 2 CPU threads" in line for line in lines), lines
