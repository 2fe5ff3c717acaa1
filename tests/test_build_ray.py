"""`zerogr build --engine ray`: a partitioned build on a real Ray cluster on 127.0.0.1 (one in this process
for the whole session, and one started with `ray start --head` for --ray-address) publishes the local
build's version byte for byte, refuses bad input with the local build's line, and survives faults."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.base.errors import InputError
from zerogr_build.config import load_settings
from zerogr_build.index.pack import WORD_BITS_ENV, packable
from zerogr_build.pipeline import build_bundle

from .cli_runs import REPO
from .ray_heads import (
    ray_processes_die_with_this_process,
    session_processes,
    start_ray_head,
    stop_ray_head,
    wait_until_gone,
)

pytestmark = pytest.mark.xdist_group("ray")  # one worker runs them all: one cluster per test session

#: Manifest fields that describe the run, not the version: the only ones a Ray build may change (a local
#: build records its build_timings; a Ray build does not).
RUN_FIELDS = ("created_at", "build_timings")
RUN_SETTINGS = ("engine", "ray_address", "partitions")


#: Ray's GCS marks a node dead after this many missed health checks (3 s apart; 5 by default): its raylet
#: then exits, and the core worker of every driver on that node ends its process, the xdist worker itself
#: for the cluster in this process. A machine shared with heavy jobs can stall a raylet for 15 s.
PATIENT_HEALTH_CHECKS = {"health_check_failure_threshold": 40}


@pytest.fixture(scope="session")
def ray_cluster():
    """A Ray instance in this process (2 CPUs, 127.0.0.1), shared by every in-process build; its processes
    end with this process, however it ends (tests/ray_heads.py)."""
    ray = pytest.importorskip("ray") if os.environ.get("ZEROGR_ALLOW_NO_RAY") else __import__("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written to the user's ~/.ray
    with ray_processes_die_with_this_process():
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
            _system_config=PATIENT_HEALTH_CHECKS,
        )  # fmt: skip
        yield ray
        ray.shutdown()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: Ray's authentication variables: unset for the `ray start --head` cluster and its CLI drivers, which find
#: the token at ~/.ray/auth_token as on a machine where Ray made one (a `ray.init()` does, by default).
RAY_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def ray_env(home: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment without Ray's authentication variables, with HOME = `home` (where Ray looks for
    ~/.ray/auth_token), no usage reports, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_AUTH_VARIABLES}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", **({"HOME": str(home)} if home else {}), **extra}


@pytest.fixture(scope="session")
def ray_home():
    """A HOME holding a Ray token at ~/.ray/auth_token (as `ray get-auth-token --generate` writes it)."""
    home = Path(tempfile.mkdtemp(prefix="zr-ray-home-", dir="/tmp"))
    (home / ".ray").mkdir(mode=0o700)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    yield home
    shutil.rmtree(home, ignore_errors=True)


#: The memory the `ray start --head` cluster offers to tasks: enough for the small catalogs built on it,
#: too little for the one built to check the memory refusal.
HEAD_MEMORY = 2_000_000


@pytest.fixture(scope="session")
def ray_head(ray_home):
    """host:port of a Ray cluster started with `ray start --head --block` in a subprocess (its own session,
    ended at the end of the test session, or by its watchdog the moment this process dies however it dies:
    tests/ray_heads.py), on Ray's defaults: with a token at ~/.ray/auth_token, it requires token
    authentication."""
    port = _free_port()
    # Ray's socket paths live under --temp-dir and must fit AF_UNIX's 107 bytes: a short dir, not pytest's.
    temp = Path(tempfile.mkdtemp(prefix="zr-ray-", dir="/tmp"))
    head = start_ray_head(
        ["start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         f"--memory={HEAD_MEMORY}", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp}", f"--system-config={json.dumps(PATIENT_HEALTH_CHECKS)}"],
        ray_env(ray_home), temp / "ray-start.log",
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            log = (temp / "ray-start.log").read_text()[-2000:]
            assert head.poll() is None, f"ray start --head exited: {log}"
            time.sleep(0.5)
        yield address
    finally:
        stop_ray_head(head)
        shutil.rmtree(temp, ignore_errors=True)


# --- catalogs ---------------------------------------------------------------------------------------------


def _sids(
    n: int, sizes: tuple[int, ...], seed: int, skew: float = 0.0, dup_share: float = 0.05
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dup_share == 0.0 and not skew:  # unique SIDs: every SID names one item, no leaf map
        codes = rng.choice(int(np.prod(sizes)), size=n, replace=False)
        return np.stack(np.unravel_index(codes, sizes), axis=1).astype(np.int64)
    sids = rng.integers(0, sizes, size=(n, len(sizes)))
    if skew:
        sids[rng.random(n) < skew, 0] = sizes[0] // 2
    dups = rng.random(n) < dup_share
    sids[dups] = sids[rng.integers(0, n, size=int(dups.sum()))]
    return sids


def _ids(n: int, kind: str, seed: int) -> pa.Array:
    ids = np.random.default_rng(seed + 1).permutation(n * 3)[:n] + 7
    if kind == "string":
        return pa.array([f"item-{i}" for i in ids])
    if kind == "uint64":
        return pa.array(ids.astype(np.uint64) + np.uint64(2**63), type=pa.uint64())
    return pa.array(ids, type=pa.int64())


def write_catalog(
    folder: Path, sids: np.ndarray, ids: pa.Array, files: int = 1, row_group: int = 700, columns: bool = False
) -> Path:
    """The catalog as `files` Parquet files (list column `sid`, or columns t0.. with columns=True)."""
    folder.mkdir(parents=True, exist_ok=True)
    cuts = np.linspace(0, len(ids), files + 1).astype(int)
    for k in range(files):
        part = sids[cuts[k] : cuts[k + 1]]
        if columns:
            table = pa.table(
                {"item_id": ids[cuts[k] : cuts[k + 1]], **{f"t{t}": part[:, t] for t in range(part.shape[1])}}
            )
        else:
            table = pa.table(
                {"item_id": ids[cuts[k] : cuts[k + 1]], "sid": pa.array(part.tolist(), pa.list_(pa.int32()))}
            )
        pq.write_table(table, folder / f"part-{k:03d}.parquet", row_group_size=row_group)
    return folder


def _build(catalog, out: Path, **overrides):
    settings = load_settings(None, {"out": str(out), "kernel_archs": (), **overrides})
    return build_bundle(str(catalog), settings)


def assert_same_version(local: Path, ray: Path) -> None:
    """Every file of the two versions byte for byte; the manifests equal but for the run's fields."""
    names = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(ray).as_posix() for p in ray.rglob("*") if p.is_file())
    for name in names:
        if name != "manifest.json":
            assert (local / name).read_bytes() == (ray / name).read_bytes(), name
    a, b = (json.loads((v / "manifest.json").read_text()) for v in (local, ray))
    for manifest in (a, b):
        for key in RUN_FIELDS:
            manifest.pop(key, None)
        for key in (*RUN_SETTINGS, "out"):  # (the two builds publish into different OUT dirs here)
            manifest["settings"].pop(key)
    assert a == b


def build_both(catalog, tmp_path: Path, partitions: int, **overrides) -> dict:
    local = _build(catalog, tmp_path / "out-local", **overrides)
    ray = _build(catalog, tmp_path / "out-ray", engine="ray", partitions=partitions, **overrides)
    assert_same_version(Path(local["bundle"]), Path(ray["bundle"]))
    assert ray["steps"] == local["steps"] and ray["items"] == local["items"]
    assert {k: ray[k] for k in ("collisions", "shared_sids", "items_in_shared_sids")} == {
        k: local[k] for k in ("collisions", "shared_sids", "items_in_shared_sids")
    }
    return ray


# --- byte for byte ----------------------------------------------------------------------------------------

CASES = {
    # name: (n, sizes, id kind, files, partitions, step formats, skew, dup share, sid columns)
    "int64-shared-auto-multifile": (5000, (8, 32, 32), "int64", 3, 3, "auto", 0.0, 0.05, False),
    "uint64-unique-sparse": (4000, (16, 64, 64), "uint64", 1, 2, "sparse", 0.0, 0.0, False),
    "string-shared-dense": (3000, (6, 12, 10), "string", 2, 4, "dense", 0.0, 0.05, True),
    "skewed-first-token-auto": (6000, (10, 40, 40, 16), "int64", 2, 5, "auto", 0.6, 0.05, False),
    "skewed-first-token-dense-step1": (
        4000,
        (10, 12, 40),
        "string",
        1,
        4,
        "0=dense,1=dense",
        0.6,
        0.02,
        False,
    ),
    "skewed-first-token-sparse-step1": (6000, (10, 40, 40), "int64", 2, 5, "sparse", 0.6, 0.05, False),
    "more-partitions-than-first-tokens": (2000, (2, 2, 50), "int64", 1, 8, "auto", 0.0, 0.05, False),
    "one-item": (1, (4, 4, 4), "int64", 1, 4, "auto", 0.0, 0.0, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ray_build_is_byte_identical_to_the_local_build(case, ray_cluster, tmp_path):
    n, sizes, kind, files, parts, formats, skew, dups, columns = CASES[case]
    sids = _sids(n, sizes, seed=len(case), skew=skew, dup_share=dups)
    catalog = write_catalog(tmp_path / "cat", sids, _ids(n, kind, seed=n), files=files, columns=columns)
    overrides = {"codebook_sizes": sizes, "step_formats": formats}
    if columns:
        overrides["sid_columns"] = tuple(f"t{t}" for t in range(len(sizes)))
    ray = build_both(catalog, tmp_path, parts, **overrides)
    engine = ray["engine"]
    assert engine["partitions"] == parts and sum(engine["partition_rows"]) == n
    if skew:  # one first token holds 60%: the cut goes inside it, on the second token
        assert engine["cut_inside_first_token"]
    if "unique" in case:
        assert ray["shared_sids"] == 0 and not any(Path(ray["bundle"]).glob("leaves*"))
    if case == "more-partitions-than-first-tokens":  # 4 two-token ranges of ~500 items for 8 partitions
        assert engine["partition_rows"].count(0) >= parts - sizes[0] * sizes[1]


def test_inferred_codebook_sizes_give_the_local_version(ray_cluster, tmp_path):
    sids = _sids(3000, (7, 30, 20), seed=3)
    catalog = write_catalog(tmp_path / "cat", sids, _ids(3000, "int64", 3), files=2)
    with pytest.warns(UserWarning, match="codebook sizes inferred"):
        ray = build_both(catalog, tmp_path, 3, codebook_sizes="infer")
    assert ray["codebook_inferred"]


def test_past_the_key_width_each_partition_packs_in_one_word(ray_cluster, tmp_path, monkeypatch):
    sizes = (8, 64, 64, 64)  # tokens 1..3 take 18 bits; 3000 rows 12 bits; partitions of < 2048 rows 11
    monkeypatch.setenv(WORD_BITS_ENV, "29")
    assert not packable(3000, sizes)  # the local build takes the multi-word path
    catalog = write_catalog(tmp_path / "cat", _sids(3000, sizes, seed=5), _ids(3000, "int64", 5))
    ray = build_both(catalog, tmp_path, 3, codebook_sizes=sizes)
    assert ray["engine"]["one_word_keys"] and packable(max(ray["engine"]["partition_rows"]), sizes)


def test_a_catalog_on_object_storage_gives_the_local_version(ray_cluster, s3_bucket, tmp_path):
    import boto3

    sids = _sids(3000, (8, 32, 32), seed=9)
    local_copy = write_catalog(tmp_path / "cat", sids, _ids(3000, "string", 9), files=2)
    client = boto3.client("s3")
    for part in sorted(local_copy.iterdir()):
        client.upload_file(str(part), s3_bucket, f"catalog/{part.name}")
    ray = build_both(f"s3://{s3_bucket}/catalog/", tmp_path, 2, codebook_sizes=(8, 32, 32))
    assert ray["catalog"]["path"] == f"s3://{s3_bucket}/catalog/"


# --- bad input: the local build's line, nothing published -------------------------------------------------


def _refusal(catalog, out: Path, **overrides) -> str:
    with pytest.raises(InputError) as caught:
        _build(catalog, out, **overrides)
    assert not any(out.glob("v*")) if out.exists() else True
    return str(caught.value)


@pytest.mark.parametrize("fault", ["token-out-of-range", "duplicate-id-across-partitions", "null-sid"])
def test_bad_row_in_one_split_is_the_local_builds_error(fault, ray_cluster, tmp_path):
    sizes = (8, 32, 32)
    sids = _sids(4000, sizes, seed=11, dup_share=0.0)
    ids = _ids(4000, "int64", 11).to_pylist()
    sid_lists = sids.tolist()
    if fault == "token-out-of-range":
        sid_lists[2900][2] = 99
        sid_lists[3500][1] = 40
    elif fault == "duplicate-id-across-partitions":
        sid_lists[100][0], sid_lists[3100][0] = 0, 7  # far apart in first-token order
        ids[3100] = ids[100]
        ids[3700] = ids[200]
    else:
        sid_lists[2222] = None
    folder = tmp_path / "cat"
    folder.mkdir()
    for k, (lo, hi) in enumerate([(0, 2000), (2000, 4000)]):
        table = pa.table(
            {
                "item_id": pa.array(ids[lo:hi], pa.int64()),
                "sid": pa.array(sid_lists[lo:hi], pa.list_(pa.int32())),
            }
        )
        pq.write_table(table, folder / f"part-{k}.parquet", row_group_size=500)
    local = _refusal(folder, tmp_path / "out-local", codebook_sizes=sizes)
    ray = _refusal(folder, tmp_path / "out-ray", codebook_sizes=sizes, engine="ray", partitions=4)
    assert ray == local
    assert "part-1.parquet" in ray


# --- faults -------------------------------------------------------------------------------------------------


def test_a_worker_killed_mid_partition_is_retried_and_the_version_is_identical(
    ray_cluster, tmp_path, monkeypatch
):
    from zerogr_build.distributed.tasks import KILL_WORKER_ENV

    marker = tmp_path / "killed-once"
    monkeypatch.setenv(KILL_WORKER_ENV, str(marker))
    catalog = write_catalog(tmp_path / "cat", _sids(3000, (8, 32, 32), seed=13), _ids(3000, "int64", 13))
    build_both(catalog, tmp_path, 2, codebook_sizes=(8, 32, 32))
    assert marker.exists()  # a partition's worker did die (SIGKILL) and Ray ran the task again


def _cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`zerogr ARGS` in its own process; `env` = ray_env(...) (default: no Ray token anywhere it looks)."""
    zerogr = Path(sys.executable).with_name("zerogr")
    full_env = env if env is not None else ray_env()
    return subprocess.run([str(zerogr), *args], capture_output=True, text=True, env=full_env, timeout=timeout)


@pytest.fixture(scope="module")
def small_catalog(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ray-cli")
    return write_catalog(folder / "cat", _sids(3000, (8, 32, 32), seed=17), _ids(3000, "int64", 17), files=2)


COMMON = ("--codebook-sizes", "8,32,32", "--kernel-archs", "", "-q")


#: Where the driver is killed: after the map tasks, after the partitions are built, after one partition's
#: slices are written (the publish protocol's own steps are tested in test_bundle_publish.py).
DRIVER_KILL_STAGES = ("ray_read", "ray_built", "partition_written")


def test_a_driver_killed_at_any_stage_publishes_nothing_and_the_next_build_succeeds(
    ray_head, ray_home, small_catalog, tmp_path
):
    """Also: the documented command works as written against a `ray start --head` cluster that requires
    the token at ~/.ray/auth_token (nothing about authentication set)."""
    out = tmp_path / "out"
    ray_args = ("--engine", "ray", "--ray-address", ray_head, "--partitions", "3")
    for stage in DRIVER_KILL_STAGES:
        killed = _cli(
            "build",
            str(small_catalog),
            "-o",
            str(out),
            *COMMON,
            *ray_args,
            env=ray_env(ray_home, ZEROGR_BUNDLE_KILL_AT=stage),
        )
        assert killed.returncode == -signal.SIGKILL, (stage, killed.stderr)
        assert not list(out.glob("v*")) and not (out / "LATEST").exists(), stage
    again = _cli("build", str(small_catalog), "-o", str(out), *COMMON, *ray_args, env=ray_env(ray_home))
    assert again.returncode == 0, again.stderr
    local = _build(small_catalog, tmp_path / "local", codebook_sizes=(8, 32, 32))
    version = Path(again.stdout.strip())
    assert version.name == "v000001" and (out / "LATEST").read_text().strip() == "v000001"
    assert_same_version(Path(local["bundle"]), version)


def test_bad_row_over_the_cli_exits_2_with_the_local_line(ray_head, ray_home, tmp_path):
    sids = _sids(2000, (8, 32, 32), seed=19).tolist()
    sids[1500][0] = 8
    table = pa.table(
        {"item_id": pa.array(range(2000), pa.int64()), "sid": pa.array(sids, pa.list_(pa.int32()))}
    )
    (tmp_path / "cat").mkdir()
    pq.write_table(table, tmp_path / "cat" / "part.parquet", row_group_size=400)
    local = _cli("build", str(tmp_path / "cat"), "-o", str(tmp_path / "a"), *COMMON)
    ray = _cli(
        "build",
        str(tmp_path / "cat"),
        "-o",
        str(tmp_path / "b"),
        *COMMON,
        "--engine",
        "ray",
        "--ray-address",
        ray_head,
        env=ray_env(ray_home),
    )
    assert (local.returncode, ray.returncode) == (2, 2)
    assert ray.stderr.strip().splitlines()[-1] == local.stderr.strip().splitlines()[-1]
    assert "row 1500 (item id 1500)" in ray.stderr and not list((tmp_path / "b").glob("v*"))


def test_an_unreachable_cluster_exits_3_naming_the_address(small_catalog, tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    result = _cli(
        "build",
        str(small_catalog),
        "-o",
        str(tmp_path / "out"),
        *COMMON,
        "--engine",
        "ray",
        "--ray-address",
        address,
    )
    assert result.returncode == 3, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert address in line and "--ray-address" in line
    bad = _cli(
        "build",
        str(small_catalog),
        "-o",
        str(tmp_path / "out"),
        *COMMON,
        "--engine",
        "ray",
        "--ray-address",
        "nowhere",
    )
    assert bad.returncode == 2 and "--ray-address" in bad.stderr


def test_a_partition_too_big_for_the_nodes_memory_exits_2_asking_for_more_partitions(
    ray_head, ray_home, tmp_path
):
    n = 60_000  # about 3.4 MB to build in one partition; the head offers HEAD_MEMORY (2 MB) to tasks
    catalog = write_catalog(
        tmp_path / "cat", _sids(n, (8, 32, 32), seed=23), _ids(n, "int64", 23), row_group=20_000
    )
    result = _cli(
        "build",
        str(catalog),
        "-o",
        str(tmp_path / "out"),
        *COMMON,
        "--engine",
        "ray",
        "--ray-address",
        ray_head,
        "--partitions",
        "1",
        env=ray_env(ray_home),
    )
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "--partitions (now 1) to at least 2" in line and not list((tmp_path / "out").glob("v*"))


def test_a_process_connected_to_one_cluster_refuses_to_build_on_another(ray_cluster, ray_head, tmp_path):
    """A library caller already connected to a Ray cluster asks for another one: refused, never a build on
    the connected cluster instead."""
    catalog = write_catalog(tmp_path / "cat", _sids(500, (8, 32, 32), seed=19), _ids(500, "int64", 19))
    message = _refusal(
        catalog, tmp_path / "out", codebook_sizes=(8, 32, 32), engine="ray", ray_address=ray_head
    )
    assert "already connected" in message and ray_head in message


# --- authentication, the connect deadline, a Ray driver process that ends ---------------------------------


def processes_with(run_id: str) -> dict[int, str]:
    """{pid: command line} of the processes whose environment holds ZEROGR_TEST_RUN=run_id."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"ZEROGR_TEST_RUN={run_id}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def test_a_driver_without_the_clusters_token_exits_2_naming_authentication(
    ray_head, ray_home, small_catalog, tmp_path
):
    """The token cluster refuses a driver with no token where Ray looks, or with another token: exit 2 at
    Ray's first refusal, with one line naming authentication and what to set, never exit 3 (a retry cannot
    help) after Ray's 20 lines of retries."""
    empty_home = tmp_path / "home"
    empty_home.mkdir()
    prom = tmp_path / "m.prom"
    runs = {
        "no token was found here": ray_env(empty_home),
        "the token from RAY_AUTH_TOKEN was refused": ray_env(ray_home, RAY_AUTH_TOKEN="0" * 64),
    }
    for why, env in runs.items():
        args = ("-o", str(tmp_path / "out"), "--engine", "ray", "--ray-address", ray_head)
        result = _cli("build", str(small_catalog), *args, *COMMON, "--metrics-file", str(prom), env=env)
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(f"error: authentication to the Ray cluster at {ray_head} failed"), line
        assert why in line and "set RAY_AUTH_TOKEN" in line and "ray get-auth-token" in line, line
        assert 'zerogr_job_exit_status{job="build"} 2.0' in prom.read_text()
    assert not list((tmp_path / "out").glob("v*"))


def test_an_address_that_is_not_ray_exits_3_at_the_connect_deadline_leaving_no_process(
    small_catalog, tmp_path
):
    """A port that accepts connections and never answers (another service, a wrong port): exit 3 once the
    connect deadline passes, naming the address; no process of the build is left."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes the handshakes; nothing ever answers
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        run_id = secrets.token_hex(8)
        env = ray_env(ZEROGR_RAY_CONNECT_TIMEOUT_S="4", ZEROGR_TEST_RUN=run_id)
        args = ("-o", str(tmp_path / "out"), "--engine", "ray", "--ray-address", address)
        result = _cli("build", str(small_catalog), *args, *COMMON, env=env, timeout=120)
    assert result.returncode == 3, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"cannot connect to the Ray cluster at {address}: no answer within 4 s" in line, line
    assert processes_with(run_id) == {}


def test_a_ray_driver_process_that_ends_mid_build_is_exit_3_with_its_metrics(
    ray_head, ray_home, small_catalog, tmp_path
):
    """Ray can end its driver process itself (its core worker does when the node under it is lost): that
    process is not the one writing the version and the metrics, which reports exit 3 in one line and in the
    metrics file, publishes nothing and leaves no process behind."""
    from zerogr_build.distributed.tasks import KILL_WORKER_ENV

    started, prom, out = tmp_path / "partition-started", tmp_path / "m.prom", tmp_path / "out"
    run_id = secrets.token_hex(8)
    env = ray_env(ray_home, ZEROGR_TEST_RUN=run_id, **{KILL_WORKER_ENV: str(started)})
    zerogr = str(Path(sys.executable).with_name("zerogr"))
    args = ["build", str(small_catalog), "-o", str(out), *COMMON, "--engine", "ray", "--ray-address"]
    args.append(ray_head)
    build = subprocess.Popen(
        [zerogr, *args, "--metrics-file", str(prom)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 150
    while not started.exists() and build.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # a partition task has started: the build is connected and waiting on the cluster
    drivers = [pid for pid, command in processes_with(run_id).items() if "ray_process" in command]
    for pid in drivers:
        os.kill(pid, signal.SIGKILL)
    _, err = build.communicate(timeout=120)
    assert len(drivers) == 1, (drivers, err)
    assert build.returncode == 3, err
    [line] = err.strip().splitlines()
    assert "its driver process ended (killed by SIGKILL" in line and "nothing was published" in line, line
    assert 'zerogr_job_exit_status{job="build"} 3.0' in prom.read_text()
    assert not list(out.glob("v*")) and processes_with(run_id) == {}


def test_a_ray_head_dies_with_the_test_process_that_started_it(ray_home, tmp_path):
    """A test process killed with -9 (an xdist worker lost) while its `ray start --head` runs: the head,
    its GCS, raylet and every other process it started are gone within seconds, no fixture teardown run."""
    port, temp = _free_port(), Path(tempfile.mkdtemp(prefix="zr-ray-", dir="/tmp"))
    code = (
        "import json, pathlib, socket, sys, time\n"
        "from tests.ray_heads import start_ray_head\n"
        "args, env, log = json.loads(sys.argv[1]), json.loads(sys.argv[2]), pathlib.Path(sys.argv[3])\n"
        "head = start_ray_head(args, env, log)\n"
        "while socket.socket().connect_ex(('127.0.0.1', int(sys.argv[4]))) != 0 and head.poll() is None:\n"
        "    time.sleep(0.2)\n"
        "print(head.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    args = ["start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
            "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]  # fmt: skip
    tester = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(args), json.dumps(ray_env(ray_home)), str(temp / "log"),
         str(port)], cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert tester.stdout is not None
        session = int(tester.stdout.readline())
        started = session_processes(session)
        assert len(started) >= 3, started  # the watchdog, ray start, and what it started (GCS, raylet, ...)
        tester.kill()
        tester.wait()
        assert wait_until_gone(session) == []
    finally:
        tester.kill()
        shutil.rmtree(temp, ignore_errors=True)
