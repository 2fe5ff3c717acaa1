"""Versions between the front end and the engine, through vLLM's own V1 loader and batch updates (no model):
the front end pins only versions the engine announced; a new LATEST is opened, hashed and masked on the
engine's watcher thread, never in update_state or apply; a version whose codes the SID map spells past the
model's vocabulary is refused by both sides while the last good one serves; a pin the engine does not hold
and an exception while masking each end their own request with EOS, never the engine."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, build_logitsprocs

from zerogr_build.bundle import publish_bundle
from zerogr_build.index import build_index
from zerogr_build.integrations.vllm import PROCESSOR, SidLogitsProcessor
from zerogr_build.integrations.vllm import catalogs as engine_catalogs
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.admission import PIN_KEY, admit, front_view
from zerogr_build.integrations.vocab_masks import VocabMasks

L = len(tiny.SIZES)
WIDE = (8, 8, 32)  # the last codebook spelled by the SID map as tokens 48..79: past the vocabulary (64)


def publish_wide(out, sids) -> None:
    """A version whose last codebook has 32 codes: its SIDs fit the index, not the model's vocabulary."""
    publish_bundle(build_index(sids, list(WIDE)), pa.array(1000 + np.arange(sids.shape[0])), out)


class Spy:
    """The threads on which the engine opened a bundle or built vocabulary masks (the real functions run)."""

    def __init__(self, monkeypatch) -> None:
        self.threads: list[str] = []
        for name in ("open_bundle", "VocabMasks"):
            real = getattr(engine_catalogs, name)

            def spy(*args, _real=real, **kwargs):
                self.threads.append(threading.current_thread().name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(engine_catalogs, name, spy)


@pytest.fixture
def world(tmp_path, engine_config, monkeypatch):
    """A V1 processor built by vLLM's loader over a follow catalog at v000001 (its watcher reads LATEST
    every 0.2 s), and the front end's view of the same registry."""
    sids = tiny.catalog_sids(120, seed=3)
    tiny.publish(tmp_path / "out", sids[:60])
    tiny.sid_map().save(tmp_path / "sid_map.json")
    registry = tiny.write_registry(
        tmp_path / "catalogs.toml",
        {"c": {"bundle": "out", "sid_map": "sid_map.json", "follow": True}},
        poll_seconds=0.2,
    )
    config = engine_config(registry)
    spy = Spy(monkeypatch)
    (processor,) = [
        p
        for p in build_logitsprocs(config, torch.device("cpu"), False, False, [PROCESSOR]).all
        if isinstance(p, SidLogitsProcessor)
    ]
    yield dict(processor=processor, root=tmp_path, sids=sids, spy=spy)
    processor.masking.catalogs.close()


def serving(world) -> str:
    return world["processor"].masking.catalogs.live.current("c").name


def wait_until(check, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def admitted(args: dict | None = None) -> SamplingParams:
    params = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": {"catalog": "c"} | (args or {})})
    admit(params)
    return params


def decode(processor: SidLogitsProcessor, params: list[SamplingParams], seed: int = 0) -> list[list[int]]:
    """Add `params` as new rows, then L + 1 greedy steps on random logits: each row's tokens."""
    outputs: list[list[int]] = [[] for _ in params]
    added = [(i, p, [1, 5, 9], outputs[i]) for i, p in enumerate(params)]
    processor.update_state(BatchUpdate(batch_size=len(params), removed=[], added=added, moved=[]))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(L + 1):
        logits = processor.apply(torch.randn(len(params), tiny.VOCAB, generator=gen))
        for row, token in enumerate(logits.argmax(dim=1).tolist()):
            outputs[row].append(token)
    processor.update_state(BatchUpdate(batch_size=0, removed=list(range(len(params))), added=[], moved=[]))
    return outputs


def catalog(sids) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in s) for s in sids}


def test_a_new_latest_opens_on_the_watcher_and_is_pinned_only_once_announced(world):
    """J7: the front end pins the version the engine announced; after a publish, requests admitted before
    the engine has opened the new version stay on the old one, update_state and apply open nothing, and
    the opening (checksums, masks) runs on the watcher thread; then new requests decode the new version."""
    processor, spy, sids = world["processor"], world["spy"], world["sids"]
    view = front_view()
    assert view is not None and view.live.pin("c") == "v000001"
    spy.threads.clear()
    watcher = processor.masking.catalogs.live
    watcher.close()  # stop the engine's watcher for a moment: the front end must not run ahead of it
    time.sleep(0.3)
    tiny.publish(world["root"] / "out", sids[60:], 2000 + np.arange(60))
    view.live.read()
    early = admitted()
    assert early.extra_args[PIN_KEY] == "v000001"  # LATEST moved, but the engine has not announced it
    got = decode(processor, [early, admitted({"exclude": [1000, 1001]})])
    assert all(tiny.sid_codes(tokens) in catalog(sids[:60]) for tokens in got), got
    assert spy.threads == []  # update_state and apply opened nothing
    thread = threading.Thread(target=watcher.poll, name="zerogr-latest")  # the watcher's own poll
    thread.start()
    thread.join()
    assert serving(world) == "v000002" and spy.threads and set(spy.threads) == {"zerogr-latest"}
    spy.threads.clear()
    view.live.read()
    late = [admitted(), admitted({"exclude": list(range(1000, 1060))})]  # only v000001's ids: ignored
    assert [p.extra_args[PIN_KEY] for p in late] == ["v000002", "v000002"]
    got = decode(processor, late + [early], seed=1)  # the early request is re-added: still v000001
    assert all(tiny.sid_codes(tokens) in catalog(sids[60:]) for tokens in got[:2]), got
    assert tiny.sid_codes(got[2]) in catalog(sids[:60]), got
    assert spy.threads == []


def test_a_version_past_the_vocabulary_is_refused_by_both_sides(world, caplog):
    """The engine's watcher refuses it (logged, "keeps"), never announces it, and the front end keeps
    pinning the last good version, whose requests decode as before."""
    processor, sids = world["processor"], world["sids"]
    publish_wide(world["root"] / "out", sids[:40])
    wait_until(lambda: "keeps v000001" in caplog.text, "the engine did not refuse the wide version")
    assert serving(world) == "v000001"
    view = front_view()
    assert view is not None
    view.live.read()
    params = admitted()
    assert params.extra_args[PIN_KEY] == "v000001"
    (tokens,) = decode(processor, [params])
    assert tiny.sid_codes(tokens) in catalog(sids[:60]) and tokens[L] == tiny.EOS


def test_a_pin_the_engine_does_not_hold_ends_that_request_alone(world):
    """A pin the engine never opened (as from a stale record) opens nothing: that request gets only EOS,
    the other rows decode catalog SIDs."""
    processor, sids, spy = world["processor"], world["sids"], world["spy"]
    processor.masking.catalogs.live.close()  # the watcher stops before its next poll
    time.sleep(0.3)
    tiny.publish(world["root"] / "out", sids[60:])  # on disk, never opened by this engine
    stale = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": {"catalog": "c"}, PIN_KEY: "v000002"})
    spy.threads.clear()
    got = decode(processor, [admitted(), stale, admitted()])
    assert spy.threads == []
    assert got[1] == [tiny.EOS] * (L + 1)
    assert all(tiny.sid_codes(got[i]) in catalog(sids[:60]) for i in (0, 2)), got


def test_an_exception_while_masking_ends_only_its_requests(world):
    """A request whose masks cannot be applied (built for another vocabulary width) gets EOS from then on;
    the other rows of the same batch are masked as before and apply never raises."""
    processor, sids = world["processor"], world["sids"]
    params = [admitted(), admitted({"exclude": [1000]}), admitted()]
    outputs: list[list[int]] = [[], [], []]
    added = [(i, p, [1, 5, 9], outputs[i]) for i, p in enumerate(params)]
    processor.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    plan = processor._rows[1][0].plan
    wrong = VocabMasks(plan.catalog.index, plan.catalog.token_table(plan.sid_map, plan.sid_key), 80, "cpu")
    object.__setattr__(plan, "masks", wrong)  # this request's masks no longer fit the logits
    gen = torch.Generator().manual_seed(2)
    for _ in range(L + 1):
        logits = processor.apply(torch.randn(3, tiny.VOCAB, generator=gen))
        for row, token in enumerate(logits.argmax(dim=1).tolist()):
            outputs[row].append(token)
    assert outputs[1] == [tiny.EOS] * (L + 1)
    assert all(tiny.sid_codes(outputs[i]) in catalog(sids[:60]) for i in (0, 2)), outputs
