"""vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`, one for the module, on 127.0.0.1,
with zerogr's gate and two API keys) with a catalog registry: completions decode catalog SIDs, every refusal
is one line that answers nothing about the server's files (the hostile-input reproducer: paths, JSON and
Parquet files outside the allowed root, symlinks out of it, a file over the cap, another tenant's bundle),
plain and zerogr requests still work after the bad ones, a follow catalog swaps versions under load with
every answer a whole SID, and a published version the model's vocabulary cannot spell leaves the last good
one serving.

The threat model's rows (docs/serving-engines.md), each with /health answering within 1 s throughout:
megabyte "a/../" paths from four clients at once and a small file of many rows are refused with the fixed
line; beam search and the sampling parameters that could force a forbidden token are refused, the others
keep every token a catalog SID or EOS; a key scoped to one catalog hears of no other."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests_vllm.conftest import RUNNER_PROCESSOR
from zerogr_build.bundle import publish_bundle
from zerogr_build.index import build_index
from zerogr_build.integrations.vllm import PROCESSOR_V2
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.admission import NO_FILE
from zerogr_build.integrations.vllm.gate import BEAM
from zerogr_build.integrations.vllm.local_server import LocalServer

L = len(tiny.SIZES)
SECRETS = ("TOPSECRET", "db_password", "email", "ssn")
KEY, NARROW_KEY = "key-all", "key-live-only"  # the server's API keys: both catalogs, "live" only


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    """The server over a registry of "live" (follow, polled every 0.2 s), with request files allowed under
    requests/ only; secrets and another tenant's bundle beside it."""
    root = tmp_path_factory.mktemp("vllm_server")
    sids = tiny.catalog_sids(200, seed=9)
    tiny.publish(root / "live", sids[:100], 1000 + np.arange(100))
    tiny.publish(root / "other-tenant", sids[100:], 5000 + np.arange(100))
    tiny.sid_map().save(root / "sid_map.json")
    (root / "secret.json").write_text(json.dumps({"db_password": "TOPSECRET-123"}))
    pq.write_table(pa.table({"email": ["a@b.c"], "ssn": ["123-45-6789"]}), root / "private.parquet")
    requests = root / "requests"
    requests.mkdir()
    tiny.write_available(requests / "avail.parquet", range(1000, 1030))
    tiny.write_available(requests / "big.parquet", range(1000, 3000))  # over limits.request_file_bytes
    (requests / "link.parquet").symlink_to(root / "private.parquet")
    (requests / "inner-link.parquet").symlink_to(requests / "avail.parquet")
    os.mkfifo(requests / "fifo.parquet")
    tiny.write_available(requests / "many.parquet", [1000] * 50_000)  # run-length encoded: a few KB
    digest = {key: hashlib.sha256(key.encode()).hexdigest() for key in (KEY, NARROW_KEY)}
    clients = {"all": {"api_key_sha256": digest[KEY], "catalogs": ["live", "fixed"]},
               "narrow": {"api_key_sha256": digest[NARROW_KEY], "catalogs": ["live"]}}  # fmt: skip
    registry = tiny.write_registry(
        root / "catalogs.toml", {"live": {"bundle": "live", "sid_map": "sid_map.json", "follow": True},
                                 "fixed": {"bundle": "other-tenant", "sid_map": "sid_map.json"}},
        allow_paths_under=["requests"], poll_seconds=0.2, clients=clients,
        limits={"request_file_bytes": 4096, "request_ids": 1000},
    )  # fmt: skip
    assert (requests / "big.parquet").stat().st_size > 4096 > (requests / "avail.parquet").stat().st_size
    assert (requests / "many.parquet").stat().st_size < 4096
    args = ("--max-num-seqs", "32", "--gpu-memory-utilization", "0.5", "--api-key", KEY, NARROW_KEY)
    with LocalServer(tiny_model_dir, registry, RUNNER_PROCESSOR, root / "server.log", args) as running:
        yield dict(server=running, root=root, sids=sids, log=root / "server.log", serving=sids[:100])


def complete(server, zerogr: dict | None = None, *, seed: int = 0, n: int = 1, max_tokens: int = L + 1,
             key: str | None = KEY, **extra):  # fmt: skip
    """(HTTP status, the reply's JSON) of one /v1/completions request (`extra`: more body fields)."""
    rng = np.random.default_rng(seed)
    body = {"prompt": tiny.prompt(rng), "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, "n": n,
            "return_token_ids": True} | extra  # fmt: skip
    if zerogr is not None:
        body["vllm_xargs"] = {"zerogr": json.dumps(zerogr)}
    return server["server"].complete(body, api_key=key)


class HealthWatch:
    """/health polled every 0.05 s in a thread while the block runs; `worst` is its slowest answer (s)."""

    def __init__(self, server) -> None:
        self.server, self.worst, self.polls = server["server"], 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        deadline = time.monotonic() + 10  # a block faster than three polls: the server is polled after it
        while self.polls < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            try:
                seconds = self.server.health_seconds(timeout=30)
            except OSError:
                seconds = float("inf")
            self.worst, self.polls = max(self.worst, seconds), self.polls + 1


def sids_of(reply: dict) -> list[tuple[int, ...] | None]:
    """The SID of every choice; each must be 3 SID tokens then EOS."""
    out = []
    for choice in reply["choices"]:
        tokens = list(choice["token_ids"])
        assert tokens[L:] == [tiny.EOS], tokens
        out.append(tiny.sid_codes(tokens))
    return out


def catalog(sids) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in s) for s in sids}


def test_completions_decode_catalog_sids(server):
    first = catalog(server["sids"][:100])
    for seed in range(4):
        status, reply = complete(server, {"catalog": "live"}, seed=seed, n=2)
        assert status == 200, reply
        assert all(sid in first for sid in sids_of(reply))
    status, reply = complete(server, None, max_tokens=6)
    assert status == 200 and len(reply["choices"][0]["token_ids"]) == 6


def hostile(root) -> list[tuple[dict, str]]:
    """(the zerogr arguments a client sends, the one line the server must answer), per probe."""
    requests = root / "requests"
    outside = ["/etc/nonexistent", "/etc", "/etc/passwd", str(root / "secret.json"),
               str(root / "private.parquet"), str(requests / "link.parquet"), str(requests / "big.parquet"),
               "requests/avail.parquet", str(requests / ".." / "secret.json"),
               str(requests / "nope.parquet"), "link.parquet", "../secret.json"]  # fmt: skip
    probes = [({"catalog": "live", "available": path}, NO_FILE) for path in outside]
    for key, value in (("sid_map", str(root / "secret.json")), ("bundle", str(root / "other-tenant")),
                       ("item_sets", str(root / "private.parquet"))):  # fmt: skip
        probes.append(({"catalog": "live", key: value}, f"zerogr: extra_args[\"zerogr\"]: '{key}' is set by"))
    probes.append(({"catalog": "other-tenant"}, "zerogr: unknown catalog 'other-tenant'"))
    return probes


def test_hostile_paths_and_files_never_stall_the_server(server):
    """Four clients at once send 3.4 MB "a/../" paths (and one 500 kB), others a FIFO, a symlink inside the
    root and a 4 KB file of 50,000 rows (over limits.request_ids): each is refused with the fixed line at
    once, /health answers within 1 s throughout, and the reasons are in the log."""
    root = server["root"] / "requests"
    deep = [f"{root}/" + "a/../" * (680_000 if i % 5 else 100_000) + "avail.parquet" for i in range(12)]
    names = deep + ["fifo.parquet", "inner-link.parquet", "many.parquet", f"{root}/many.parquet"]
    assert len(json.dumps({"catalog": "live", "available": deep[1]})) > 3_000_000

    def one(name):
        return complete(server, {"catalog": "live", "available": name}, seed=1)

    with HealthWatch(server) as health, ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, names))
    shown = [(status, str(reply)[:300]) for status, reply in answers]
    assert all(status == 400 and r["error"]["message"].startswith(NO_FILE) for status, r in answers), shown
    assert health.polls >= 3 and health.worst < 1.0, (health.polls, health.worst)
    log = server["log"].read_text(errors="replace")
    assert "50000 rows, more than limits.request_ids = 1000" in log and "not a regular file" in log
    for prompt in (None, "w1 w2 w3"):  # token ids, and text (tokenized first)
        extra = {} if prompt is None else {"prompt": prompt}
        status, reply = complete(server, {"catalog": "live", "available": "avail.parquet"}, seed=2, **extra)
        assert status == 200 and sids_of(reply)[0] in catalog(server["sids"][:30]), reply


def test_beam_search_naming_zerogr_is_refused(server):
    """vLLM's beam search would drop the zerogr arguments: refused (a known or an unknown catalog alike);
    beam search without zerogr is vLLM's, untouched."""
    with HealthWatch(server) as health:
        for name in ("live", "nope"):
            status, reply = complete(server, {"catalog": name}, use_beam_search=True, n=2, temperature=0.0)
            assert status == 400 and reply["error"]["message"] == BEAM, reply
        status, reply = complete(server, None, use_beam_search=True, n=2, temperature=0.0, max_tokens=3)
        assert status == 200 and len(reply["choices"]) == 2, reply
    assert health.worst < 1.0


def test_sampling_params_that_could_force_a_forbidden_token_are_refused(server):
    """allowed_token_ids (here: no SID token at all), bad_words, min_tokens past the SID and stop_token_ids
    under min_tokens are refused; min_tokens up to L and ignore_eos keep every token a SID token or EOS."""
    args = {"catalog": "live"}
    refused = [
        ({"allowed_token_ids": [0, 1]}, 'zerogr: "allowed_token_ids" cannot be combined with a catalog'),
        ({"bad_words": ["w5"]}, 'zerogr: "bad_words" cannot be combined with a catalog'),
        ({"min_tokens": L + 1}, f'zerogr: "min_tokens" is {L + 1}, more than the {L} tokens'),
        ({"min_tokens": 1, "stop_token_ids": [5]}, 'zerogr: "stop_token_ids" with "min_tokens"'),
    ]
    with HealthWatch(server) as health:
        for extra, message in refused:
            status, reply = complete(server, args, seed=4, **extra)
            assert status == 400 and reply["error"]["message"].startswith(message), (extra, reply)
            status, reply = complete(server, None, seed=4, **extra)  # plain requests: vLLM's to judge
            assert status == 200, (extra, reply)
        status, reply = complete(server, args, seed=4, min_tokens=L)
        assert status == 200 and sids_of(reply)[0] in catalog(server["sids"][:100]), reply
        status, reply = complete(server, args, seed=4, ignore_eos=True, max_tokens=L + 3)
        tokens = reply["choices"][0]["token_ids"]
        assert status == 200 and tiny.sid_codes(tokens) is not None and tokens[L:] == [tiny.EOS] * 3, reply
    assert health.worst < 1.0


def test_a_key_hears_only_of_its_own_catalogs(server):
    """The narrow key gets the same line for the other registered catalog as for a name that does not
    exist; the full key may use both; no key is vLLM's 401; unknown item sets say nothing either."""
    assert complete(server, {"catalog": "fixed"}, seed=6)[0] == 200
    answers = {}
    for name in ("fixed", "nope"):
        status, reply = complete(server, {"catalog": name}, seed=6, key=NARROW_KEY)
        assert status == 400, reply
        answers[name] = reply["error"]["message"].replace(name, "NAME")
    assert answers["fixed"] == answers["nope"] and answers["nope"].startswith(
        "zerogr: unknown catalog 'NAME'"
    )
    status, reply = complete(server, {"catalog": "live"}, seed=6, key=NARROW_KEY)
    assert status == 200 and sids_of(reply)[0] in catalog(server["sids"][:100])
    assert complete(server, {"catalog": "live"}, seed=6, key=None)[0] == 401
    assert complete(server, {"catalog": "live"}, seed=6, key="not-a-key")[0] == 401
    status, reply = complete(server, {"catalog": "live", "include": ["comedy"]}, seed=6)
    assert status == 400 and reply["error"]["message"].startswith(
        "zerogr: unknown item set 'comedy' in catalog 'live'"
    )


def test_refusals_answer_nothing_about_the_servers_files(server):
    """Every probe is refused with its one line, which names no server path and no file content; the
    reasons go to the server's log; plain and zerogr requests work after them."""
    root = server["root"]
    path_answers = set()
    for args, message in hostile(root):
        status, reply = complete(server, args)
        text = reply["error"]["message"]
        assert status == 400 and text.startswith(message), (args, reply)
        if message == NO_FILE:
            path_answers.add(text)
        body = json.dumps(reply)
        assert str(root) not in body and not any(s in body for s in SECRETS), (args, body)
    assert len(path_answers) == 1  # the same line whatever is (or is not) at the path
    log = server["log"].read_text(errors="replace")
    assert "not under allow_paths_under" in log and "more than limits.request_file_bytes" in log
    status, reply = complete(server, None)
    assert status == 200
    status, reply = complete(server, {"catalog": "live"}, seed=5)
    assert status == 200 and sids_of(reply)[0] in catalog(server["sids"][:100])


def test_excluded_ids_the_catalog_lacks_are_no_oracle(server):
    """Known and unknown excluded ids get the same answer: a SID (unknown ones are ignored)."""
    for ids in ([1000], [99999], [5000]):
        status, reply = complete(server, {"catalog": "live", "exclude": ids}, seed=3)
        assert status == 200 and sids_of(reply)[0] is not None, reply


def test_an_allowed_request_file_restricts_the_items(server):
    path = str(server["root"] / "requests" / "avail.parquet")
    allowed = catalog(server["sids"][:30])  # items 1000..1029
    for seed in range(3):
        status, reply = complete(server, {"catalog": "live", "available": path}, seed=seed, n=3)
        assert status == 200 and all(sid in allowed for sid in sids_of(reply)), reply


def test_follow_swaps_under_load_without_a_gap(server):
    """Requests keep coming while a new version is published: every answer is a whole SID of one version
    (also those excluding every item of the old version), and once the server has moved, only the new one."""
    first, second = catalog(server["sids"][:100]), catalog(server["sids"][100:])

    def one(i: int, exclude=range(1000, 1050)):
        args = {"catalog": "live"} | ({"exclude": list(exclude)} if i % 3 == 0 else {})
        status, reply = complete(server, args, seed=100 + i)
        assert status == 200, reply
        return sids_of(reply)[0]

    with ThreadPoolExecutor(6) as pool:
        before = list(pool.map(one, range(12)))
        tiny.publish(server["root"] / "live", server["sids"][100:], 2000 + np.arange(100))
        during = list(pool.map(one, range(12, 48)))
    assert all(sid in first for sid in before)
    assert all(sid in first | second for sid in during)
    deadline = time.monotonic() + 30
    while one(0) not in second:  # the front end reads LATEST every 0.2 s
        assert time.monotonic() < deadline, "the server never moved to the new version"
    with ThreadPoolExecutor(
        6
    ) as pool:  # excluding every item of the old version: ignored, as Decoder.search does
        after = list(pool.map(lambda i: one(i, range(1000, 1100)), range(48, 60)))
    assert all(sid in second for sid in after)
    server["serving"] = server["sids"][100:]
    log = server["log"].read_text(errors="replace")
    assert "new requests decode v000002" in log  # the front end pinned it once the engine announced it


def health_seconds(server) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(f"{server['server'].url}/health", timeout=30) as reply:
        assert reply.status == 200
    return time.perf_counter() - start


def test_a_version_past_the_vocabulary_never_takes_the_server_down(server):
    """A follow version whose last codebook the SID map spells past the model's vocabulary (tokens up to 79
    of 64) is published under load: the engine refuses it, the front end never pins it, every request
    answers 200 with a SID of the last good version, and /health answers within 1 s throughout."""
    good = catalog(server["serving"])
    wide = server["sids"][:50].copy()
    wide[:, 2] += 8 * (np.arange(50) % 4)  # codes up to 31 of a 32-code last codebook
    stop, health = threading.Event(), []

    def probe():
        while not stop.is_set():
            health.append(health_seconds(server))
            time.sleep(0.1)

    def one(i: int):
        status, reply = complete(server, {"catalog": "live"}, seed=300 + i)
        assert status == 200, reply
        return sids_of(reply)[0]

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            before = list(pool.map(one, range(8)))
            index = build_index(wide, [8, 8, 32])
            bad = publish_bundle(index, pa.array(7000 + np.arange(50), pa.int64()), server["root"] / "live")
            log = server["log"]
            deadline = time.monotonic() + 30
            while "keeps" not in log.read_text(errors="replace"):  # the engine read and refused it
                assert time.monotonic() < deadline, "the engine never read the new LATEST"
                time.sleep(0.1)
            after = list(pool.map(one, range(8, 40)))  # the front end reads the engine's record every 0.2 s
    finally:
        stop.set()
        prober.join()
    assert all(sid in good for sid in before + after)
    assert health and max(health) < 1.0, max(health)
    text = server["log"].read_text(errors="replace")
    assert "beyond the model's vocabulary" in text and "EngineDeadError" not in text
    assert "new requests decode v000001" in text  # the front end pins what the engine announced
    assert f"new requests decode {bad.path.name}" not in text and f"now serves {bad.path.name}" not in text
    assert server["server"].proc.poll() is None


def test_the_runner_is_the_one_its_processor_is_for(server):
    """vLLM logs "Using V2 Model Runner" exactly when Model Runner V2 runs; the processor given is its class
    (the other runner's class would have stopped the server at start)."""
    log = server["log"].read_text(errors="replace")
    assert ("Using V2 Model Runner" in log) == (RUNNER_PROCESSOR == PROCESSOR_V2)
