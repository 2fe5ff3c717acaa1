"""`zerogr rebuild` benchmark: a from-scratch rebuild and a rebuild after a 3% churn, each stage's seconds
and peak memory, next to a plain `zerogr build` of the churned catalog, in the same run.

Per size in --items (default 20M and 100M items; L=4, V=1024, int64 item ids, skewed SIDs): catalog A
(zerogr_build.synthetic, seed 0) and catalog B, A after a normal churn: every 33rd item removed (3%) and
3% new items added, every other item keeping its SID (same model tag, so the guards pass). Both are
written once to --workdir (not timed). Then, each in its own process (after a small warm-up rebuild, so
the numba cache is warm):

1. `zerogr rebuild A --out OUT`: from scratch (no LATEST: build, verify, tune measured, verify, promote);
2. `zerogr rebuild B --out OUT`: after the churn (build, verify, the guards against A's version, tune
   reusing A's plan, verify, promote), as every later run of a cron job goes: the tune device's identity
   comes from what run 1 remembered in OUT (no probe process);
3. `zerogr build B --out OTHER`: the plain build of the same catalog, for reference.

For each: wall time, and per stage of the rebuild (the rebuild's own stage timer: setup, inputs, build,
verify, guards, tune, promote) its seconds, peak RSS and peak anonymous RSS (RssAnon: what the kernel
cannot reclaim; the rest is page cache of memory-mapped files) of the run and its child processes (the
device probe of plan reuse: their proportional share), sampled from /proc every 20 ms by this process.
`run/build` is the whole run's wall time over its build stage; the summary line also gives it over the
plain build's wall time. The targets: after the churn at 20M, run/build <= 2.5; at 100M, guards (the
comparison) <= build and the run's anonymous peak <= its build stage's.

    python scripts/bench_rebuild.py --workdir DIR                 # 20M and 100M (about 10 GB of disk)
    python scripts/bench_rebuild.py --items 1000000 --repeats 2   # a quick run, twice
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_build import REPO

from zerogr_build import synthetic

SIZES = (1024, 1024, 1024, 1024)
SEED = 0
DEFAULT_ITEMS = (20_000_000, 100_000_000)
#: Every CHURN_EVERY-th item of A is removed in B, and as many new items (3%) are added.
CHURN_EVERY = 33
TARGET_CHURN_RATIO = 2.5
#: Environment variable naming the file where the child writes its stage spans (see _child).
SPANS_ENV = "ZEROGR_BENCH_REBUILD_SPANS"


@dataclass
class Sampled:
    """One process: wall seconds, exit code, stderr tail, and its memory sampled (time.time(), RSS,
    RssAnon) in bytes."""

    wall: float
    code: int
    stderr: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def peak(self, start: float = 0.0, end: float = float("inf")) -> tuple[int, int]:
        """(peak RSS, peak anonymous RSS) of the samples in start..end (the whole run by default)."""
        inside = [(rss, anon) for t, rss, anon in self.samples if start <= t <= end]
        if not inside:  # a stage shorter than a sampling period: the nearest sample before it
            before = [(rss, anon) for t, rss, anon in self.samples if t <= start]
            inside = before[-1:] or [(0, 0)]
        return max(r for r, _ in inside), max(a for _, a in inside)


def run_sampled(command: list[str], env: dict[str, str] | None = None) -> Sampled:
    """Run `command`, sampling the RSS and RssAnon of it and its child processes every 20 ms from /proc."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO, env=env)
        samples: list[tuple[float, int, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                rss, anon = tree_memory(proc.pid)
                if rss:
                    samples.append((time.time(), rss, anon))
                done.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        err.seek(0)
        return Sampled(wall, code, err.read().decode(errors="replace")[-3000:], samples)


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, anonymous RSS) in bytes of process `pid` (VmRSS, RssAnon) plus every process under it (a
    rebuild's helper processes count: their Pss and Pss_Anon, so pages shared with the parent are not
    counted twice), from /proc; (0, 0) once it is gone. A child whose command line is still its parent's
    has not exec'd yet (fork or vfork before `nvcc --version`, say): its pages are its parent's, and it
    is skipped."""
    rss = anon = 0
    pending = [(pid, "status", ("VmRSS:", "RssAnon:"), None)]
    while pending:
        p, name, fields, parent_cmdline = pending.pop()
        try:
            cmdline = _cmdline(p)
            if parent_cmdline is not None and cmdline == parent_cmdline:
                continue
            with open(f"/proc/{p}/{name}") as status:
                for line in status:
                    if line.startswith(fields[0]):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith(fields[1]):
                        anon += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as children:
                shares = ("Pss:", "Pss_Anon:")
                pending.extend((int(c), "smaps_rollup", shares, cmdline) for c in children.read().split())
        except (OSError, ValueError):
            continue
    return rss, anon


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def write_catalogs(items: int, workdir: Path) -> tuple[Path, Path]:
    """(catalog A, catalog B) for `items` items, written once (see the module docstring)."""
    a = workdir / f"rebuild_a_{items}.parquet"
    b = workdir / f"rebuild_b_{items}.parquet"
    if a.exists() and b.exists():
        return a, b
    added = len(range(0, items, CHURN_EVERY))
    sids = synthetic.generate_sids(items + added, SIZES, SEED, "skewed")
    ids = synthetic.make_item_ids(items + added, "int64", SEED)
    table = synthetic.catalog_table(sids[:items], ids.slice(0, items))
    pq.write_table(table, a, row_group_size=1_000_000)
    del table
    keep = np.ones(items + added, dtype=bool)
    keep[0:items:CHURN_EVERY] = False
    table = synthetic.catalog_table(sids[keep], ids.filter(pa.array(keep)))
    pq.write_table(table, b, row_group_size=1_000_000)
    return a, b


def _zerogr(*args: object) -> list[str]:
    return [sys.executable, str(REPO / "cli.py"), *map(str, args)]


def _rebuild(catalog: Path, out: Path, spans: Path, tune_args: str) -> tuple[Sampled, list[list]]:
    """One `zerogr rebuild` in a child process (this script's --child mode): its samples and its stage
    spans [[stage, start, end], ...] (time.time())."""
    sizes = ",".join(map(str, SIZES))
    env = {**os.environ, SPANS_ENV: str(spans)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "rebuild", str(catalog)]
    command += ["--out", str(out), "--codebook-sizes", sizes, "--device", "cpu"]
    if tune_args:
        command += ["--tune-args", tune_args]
    run = run_sampled(command, env)
    if run.code != 0:
        raise RuntimeError(f"rebuild of {catalog.name} failed (exit {run.code}): {run.stderr}")
    return run, json.loads(spans.read_text())


@dataclass
class Row:
    items: int
    run: str  # "scratch", "churn" or "build"
    wall: float
    peak: int
    anon: int
    stages: dict[str, tuple[float, int, int]]  # stage -> (seconds, peak RSS, peak anon)

    @property
    def build_s(self) -> float:
        return self.stages["build"][0] if "build" in self.stages else self.wall


def _row(items: int, name: str, run: Sampled, spans: list[list]) -> Row:
    stages: dict[str, tuple[float, int, int]] = {}
    for stage, start, end in spans:
        seconds, peak, anon = stages.get(stage, (0.0, 0, 0))
        p, a = run.peak(start, end)
        stages[stage] = (seconds + end - start, max(peak, p), max(anon, a))
    peak, anon = run.peak()
    return Row(items, name, run.wall, peak, anon, stages)


def bench(items: int, workdir: Path, tune_args: str) -> list[Row]:
    a, b = write_catalogs(items, workdir)
    out, other = workdir / "rebuild_bundles", workdir / "rebuild_plain"
    for path in (out, other):
        shutil.rmtree(path, ignore_errors=True)
    spans = workdir / "spans.json"
    rows = []
    for name, catalog in (("scratch", a), ("churn", b)):
        run, stage_spans = _rebuild(catalog, out, spans, tune_args)
        rows.append(_row(items, name, run, stage_spans))
    sizes = ",".join(map(str, SIZES))
    plain = run_sampled(_zerogr("build", b, "--out", other, "--codebook-sizes", sizes, "--quiet"))
    if plain.code != 0:
        raise RuntimeError(f"plain build of {b.name} failed (exit {plain.code}): {plain.stderr}")
    peak, anon = plain.peak()
    rows.append(Row(items, "build", plain.wall, peak, anon, {}))
    for path in (out, other):
        shutil.rmtree(path, ignore_errors=True)
    return rows


STAGES = ("setup", "inputs", "build", "verify", "guards", "tune", "promote")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def print_table(rows: list[Row]) -> None:
    print(f"zerogr rebuild: L=4 V=1024, int64 ids; churn = every {CHURN_EVERY}rd item removed, 3% added, the")
    print("rest keep their SIDs; each run in its own process; per stage: seconds / peak RSS GB / anon GB;")
    print(
        "`build` = a plain zerogr build of the churned catalog; run/build = wall over the run's build stage"
    )
    header = f"{'items':>12} {'run':<8}{'wall s':>8}{'run/build':>10}{'peak GB':>9}{'anon GB':>9}  stages"
    print(header)
    print("-" * (len(header) + 60))
    for r in rows:
        parts = [
            f"{s} {r.stages[s][0]:.1f}s/{_gb(r.stages[s][1])}/{_gb(r.stages[s][2])}"
            for s in STAGES
            if s in r.stages
        ]
        ratio = r.wall / r.build_s if r.stages else 1.0
        inner = sum(s for s, _, _ in r.stages.values()) / r.build_s if r.stages else 1.0
        print(
            f"{r.items:>12,} {r.run:<8}{r.wall:>8.1f}{ratio:>10.2f}{inner:>13.2f}{_gb(r.peak):>9}"
            f"{_gb(r.anon):>9}  " + ", ".join(parts)
        )
    for i, r in enumerate(rows):
        if r.run != "churn":
            continue
        plain = next((p for p in rows[i:] if p.run == "build" and p.items == r.items), None)
        build_s, build_anon = r.stages["build"][0], r.stages["build"][2]
        guards_s = r.stages.get("guards", (0.0, 0, 0))[0]
        ratio = r.wall / build_s
        inner = sum(s for s, _, _ in r.stages.values()) / build_s
        verdict = "met" if ratio <= TARGET_CHURN_RATIO else "NOT met"
        print(
            f"{r.items:,} churn: run/build {ratio:.2f} (target <= {TARGET_CHURN_RATIO}: {verdict}; "
            f"stages/build {inner:.2f}"
            + (f"; over the plain build {r.wall / plain.wall:.2f}" if plain else "")
            + "); guards "
            f"{guards_s:.1f} s vs build {build_s:.1f} s; run anon peak {_gb(r.anon)} GB vs build stage's "
            f"{_gb(build_anon)} GB"
        )


def _child(argv: list[str]) -> int:
    """Run the zerogr CLI in this process, recording the rebuild's stage spans into the file SPANS_ENV
    names (the rebuild's own stage timer, wrapped; nothing else changes)."""
    import contextlib

    from zerogr_build.cli import main as zerogr
    from zerogr_build.rebuild import run

    spans: list[list] = []
    timed = run._Stages.__call__

    @contextlib.contextmanager
    def recorded(self, name):  # type: ignore[no-untyped-def]
        start = time.time()
        try:
            with timed(self, name):
                yield
        finally:
            spans.append([name, start, time.time()])

    run._Stages.__call__ = recorded  # type: ignore[method-assign]
    try:
        zerogr(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    Path(os.environ[SPANS_ENV]).write_text(json.dumps(spans))
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default=",".join(map(str, DEFAULT_ITEMS)), help="comma-separated sizes")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every size (all rows printed)")
    parser.add_argument("--tune-args", default="", help="zerogr tune options for the rebuilds")
    parser.add_argument("--workdir", type=Path, default=None, help="where the catalogs go (default: tmp)")
    parser.add_argument("--skip-warmup", action="store_true", help="no warm-up rebuilds (numba cache cold?)")
    args = parser.parse_args(argv)
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "zerogr_bench_rebuild").resolve()
    workdir.mkdir(parents=True, exist_ok=True)  # kept: catalogs this size are worth reusing
    if not args.skip_warmup:
        warm = workdir / "warmup"
        warm.mkdir(exist_ok=True)
        a, b = write_catalogs(20_000, warm)
        for catalog in (a, b):
            _rebuild(catalog, warm / "bundles", warm / "spans.json", args.tune_args)
        shutil.rmtree(warm, ignore_errors=True)
    rows = []
    for items in (int(x) for x in args.items.split(",")):
        for k in range(args.repeats):
            print(f"zerogr rebuild: {items:,} items, run {k + 1} ...", file=sys.stderr, flush=True)
            rows += bench(items, workdir, args.tune_args)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
