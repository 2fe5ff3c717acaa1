"""Build benchmark: zerogr's index build vs a STATIC-style baseline, plus end-to-end `zerogr build`.

In one run, on catalogs from zerogr_build.synthetic (scripts/make_catalog.py; skewed mode, fixed seed):

1. In memory, per catalog (10M items L=4 V=2048; 3M items L=3 V=8192): both builds start from the same
   raw, unsorted SIDs [N, L] (uint16, catalog order, duplicates included).
   * ours: `zerogr_build.build_index(raw, sizes)` (numba cache warmed by a small build first).
   * baseline: STATIC's own build ported to vectorised numpy (benchmarks/static_baseline.py), timed
     including the np.lexsort + dedupe that gives it the sorted distinct SIDs it requires.
   The two sides alternate within every repeat (ours first in even repeats, STATIC first in odd ones), so
   a burst of load on the shared machine hits both; every run is printed, the table shows medians.
   Bytes: ours `SidIndex.index_bytes` (every step table; leaf_offsets, the leaf -> items map STATIC has
   no counterpart for, is printed beside it); STATIC: nbytes of its arrays (packed_csr, indptr,
   start_mask, dense_mask, dense_states; d=2, V = largest codebook). "counts" checks
   static_layout_bytes (what `zerogr inspect` shows) against those real arrays.
2. End to end: a Parquet catalog of 20M items is written first (not timed), then `python cli.py build`
   runs in a subprocess (after a small warm-up build, so the numba cache on disk is warm): wall time,
   items/s and the child's peak RSS (os.wait4 rusage).

Targets (2-core machine): build >= 12x faster than the baseline (median of the interleaved runs) and
index <= 0.40x its bytes on both catalogs; end to end >= 3M items/s and peak RSS <= 80 bytes/item.

    python scripts/bench_build.py                 # full sizes (needs ~6 GB RAM, a few minutes)
    python scripts/bench_build.py --scale 0.05    # quick run (targets still printed, marked scaled)
    python scripts/bench_build.py --skip-e2e      # in-memory comparison only
    python scripts/bench_build.py --scale         # also end to end at 50M and 100M items (needs
                                                  # ~3 GB of disk per catalog, written once to --workdir)

With a bare `--scale`, the table "end to end at scale" adds one row per size in --scale-items (time,
items/s, peak bytes/item, index bytes, leaf-map bytes as bundle format 2 stores it, and the CLI's own
stage timings: startup is wall minus their sum). Targets: at 100M items, peak RSS <= 27
bytes/item and >= 7.5M items/s with the numba cache warm. Then the cold first run: the README's 1M-item
build with an empty numba cache, next to the same build warm (--cold-items; 0 skips it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _yardsticks import yardstick

from zerogr_build import synthetic
from zerogr_build.index import build_index
from zerogr_build.index.static_layout import static_layout_bytes
from zerogr_build.index.tables import leaf_map_dtype

REPO = Path(__file__).resolve().parents[1]
static_baseline = yardstick("static_baseline")

IN_MEMORY_CATALOGS = ((10_000_000, 4, 2048), (3_000_000, 3, 8192))
E2E_ITEMS = 20_000_000
TARGET_SPEEDUP = 12.0
TARGET_BYTES_RATIO = 0.40
TARGET_ITEMS_PER_S = 3_000_000
TARGET_RSS_PER_ITEM = 80.0
SEED = 0
SCALE_ITEMS = (50_000_000, 100_000_000)
TARGET_SCALE_RSS_PER_ITEM = 27.0
TARGET_SCALE_ITEMS_PER_S = 7_500_000


@dataclass
class InMemoryResult:
    items: int
    steps: int
    codebook: int
    distinct_sids: int
    ours_runs: list[float]  # seconds of every run, in order; ours_runs[k] and static_runs[k] ran back to back
    static_runs: list[float]
    ours_bytes: int
    leaf_map_bytes: int
    static_bytes: int
    layout_count_matches: bool

    @property
    def ours_s(self) -> float:
        return statistics.median(self.ours_runs)

    @property
    def static_s(self) -> float:
        return statistics.median(self.static_runs)

    @property
    def speedup(self) -> float:
        """Median STATIC seconds / median ours."""
        return self.static_s / self.ours_s

    @property
    def run_speedups(self) -> list[float]:
        """STATIC / ours of each interleaved pair."""
        return [s / o for o, s in zip(self.ours_runs, self.static_runs, strict=True)]

    @property
    def bytes_ratio(self) -> float:
        return self.ours_bytes / self.static_bytes


@dataclass
class EndToEndResult:
    items: int
    steps: int
    codebook: int
    wall_s: float
    peak_rss_bytes: int
    returncode: int
    summary: dict | None

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s

    @property
    def rss_per_item(self) -> float:
        return self.peak_rss_bytes / self.items

    @property
    def index_bytes(self) -> int | None:
        return None if self.summary is None else int(self.summary["index_bytes"])

    @property
    def leaf_map_bytes(self) -> int | None:
        """What bundle format 2 stores for the leaf map (0 when every SID names one item)."""
        if self.summary is None:
            return None
        leaves, items = int(self.summary["distinct_sids"]), int(self.summary["items"])
        dtype = leaf_map_dtype(leaves, items)
        return 0 if dtype is None else (leaves + 1) * (4 if dtype == "<i4" else 8)


def _timed(fn):
    """(seconds, result) of one call, after a gc so no earlier garbage is collected inside it."""
    gc.collect()
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def warm_up(shapes) -> None:
    """One small build per SID length, so numba's compiled kernels are loaded before timing."""
    for _, steps, codebook in shapes:
        build_index(synthetic.generate_sids(20_000, [codebook] * steps, SEED), [codebook] * steps)


def bench_in_memory(items: int, steps: int, codebook: int, repeats: int) -> InMemoryResult:
    sizes = [codebook] * steps
    raw = synthetic.generate_sids(items, sizes, SEED)
    ours_runs, static_runs = [], []
    for k in range(repeats):
        for side in ("ours", "static") if k % 2 == 0 else ("static", "ours"):
            if side == "ours":
                seconds, index = _timed(lambda: build_index(raw, sizes))
                ours_runs.append(seconds)
                ours_bytes, layout = int(index.index_bytes), static_layout_bytes(index)
                leaf_map_bytes, distinct = int(index.leaf_offsets.nbytes), index.num_leaves
                del index
            else:
                seconds, static = _timed(lambda: static_baseline.build_static_from_raw(raw, codebook, 2))
                static_runs.append(seconds)
                static_bytes = static.nbytes()
                del static
    gc.collect()
    return InMemoryResult(
        items,
        steps,
        codebook,
        distinct,
        ours_runs,
        static_runs,
        ours_bytes,
        leaf_map_bytes,
        static_bytes["total"],
        layout == static_bytes,
    )


def _cli_command(catalog: Path, out: Path, codebook: int, steps: int) -> list[str]:
    sizes = ",".join([str(codebook)] * steps)
    return [
        sys.executable,
        str(REPO / "cli.py"),
        "build",
        str(catalog),
        "--out",
        str(out),
        "--codebook-sizes",
        sizes,
        "--json",
        "--quiet",
    ]


# Runs argv[2:] as a child and writes its peak RSS (bytes) to the file argv[1]. Linux carries a process's
# RSS high-water mark across fork + exec, so a child started straight from this (large) benchmark process
# would report our own footprint; started from this small, fresh interpreter it reports only its own.
_PEAK_RSS_REAPER = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run_measured(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int, str, str]:
    """Run a command; (wall seconds, peak RSS bytes of that command alone, return code, stdout, stderr).
    env: extra environment variables for the command."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory() as d:
        peak_file = Path(d) / "peak_rss"
        reaper = [sys.executable, "-c", _PEAK_RSS_REAPER, str(peak_file)]
        started = time.perf_counter()
        proc = subprocess.run(
            [*reaper, *command], stdout=out, stderr=err, cwd=REPO, env={**os.environ, **(env or {})}
        )
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        peak = int(peak_file.read_text()) if peak_file.exists() else 0
        return wall, peak, proc.returncode, out.read().decode(), err.read().decode()


def bench_end_to_end(items: int, steps: int, codebook: int, workdir: Path) -> EndToEndResult:
    sizes = [codebook] * steps
    catalog = workdir / f"catalog_{items}_{steps}x{codebook}.parquet"
    if not catalog.exists():
        synthetic.write_catalog(catalog, items, sizes, seed=SEED)
        gc.collect()
    warm_catalog = workdir / "warmup.parquet"
    synthetic.write_catalog(warm_catalog, 20_000, sizes, seed=SEED + 1)
    warm = _run_measured(_cli_command(warm_catalog, workdir / "bundles_warmup", codebook, steps))
    if warm[2] != 0:
        raise RuntimeError(f"warm-up `zerogr build` failed (exit {warm[2]}): {warm[4].strip()[-2000:]}")
    out = workdir / "bundles"
    shutil.rmtree(out, ignore_errors=True)
    wall, rss, code, stdout, stderr = _run_measured(_cli_command(catalog, out, codebook, steps))
    if code != 0:
        print(f"`zerogr build` failed (exit {code}): {stderr.strip()[-2000:]}", file=sys.stderr)
    try:
        summary = json.loads(stdout) if code == 0 else None
    except json.JSONDecodeError:
        summary = None
    shutil.rmtree(out, ignore_errors=True)
    return EndToEndResult(items, steps, codebook, wall, rss, code, summary)


@dataclass
class ColdResult:
    items: int
    cold_s: float
    warm_s: float
    notice: bool  # the cold run said on stderr that it was compiling
    returncode: int


def bench_cold_first_run(items: int, workdir: Path) -> ColdResult:
    """The newcomer's first build: `zerogr build` of an `items`-item catalog (L=3, V=8192, the README's
    set-up command) with empty caches (NUMBA_CACHE_DIR for the build kernels, ZEROGR_CACHE_DIR for the
    nvcc-compiled CUDA kernels a bundle ships), then the same build again with the caches that first run
    left (warm). Wall times of the whole process; notice: KernelCompileWarning shown."""
    sizes = [8192] * 3
    catalog = workdir / f"cold_{items}_3x8192.parquet"
    if not catalog.exists():
        synthetic.write_catalog(catalog, items, sizes, seed=SEED)
    with tempfile.TemporaryDirectory(prefix="zerogr_cold_") as cache:
        env = {"NUMBA_CACHE_DIR": f"{cache}/numba", "ZEROGR_CACHE_DIR": f"{cache}/zerogr"}
        runs = []
        for name in ("cold", "warm"):
            out = workdir / f"bundles_{name}"
            shutil.rmtree(out, ignore_errors=True)
            runs.append(_run_measured(_cli_command(catalog, out, 8192, 3), env))
            shutil.rmtree(out, ignore_errors=True)
    (cold_s, _, cold_code, _, cold_err), (warm_s, _, warm_code, _, _) = runs
    notice = "compiling the build kernels" in cold_err
    return ColdResult(items, cold_s, warm_s, notice, cold_code or warm_code)


def print_cold(r: ColdResult) -> None:
    print(f"\ncold first run: python cli.py build, {r.items / 1e6:g}M items L=3 V=8192, empty caches")
    if r.returncode != 0:
        print(f"  FAILED with exit code {r.returncode}")
        return
    print(
        f"  cold {r.cold_s:.1f} s ({r.items / r.cold_s / 1e6:.2f}M items/s)   warm {r.warm_s:.1f} s "
        f"({r.items / r.warm_s / 1e6:.2f}M items/s)   compiling: {r.cold_s - r.warm_s:.1f} s   the cold run "
        f"{'said' if r.notice else 'did NOT say'} it was compiling"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_report(in_memory: list[InMemoryResult], e2e: EndToEndResult | None, scale: float) -> None:
    print(f"zerogr build benchmark  (cores: {os.cpu_count()}, scale {scale:g}, skewed catalogs, seed {SEED})")
    if in_memory:
        notes = [
            "Both in-memory builds start from the same raw unsorted SIDs [N, L] uint16 (catalog order,"
            " duplicates kept).",
            "Baseline = STATIC's build_index ported to numpy, timed including np.lexsort + dedupe.",
            "Seconds: medians of the interleaved runs (every run is listed below the table).",
            "Bytes: ours = SidIndex.index_bytes (the step tables); STATIC = nbytes of packed_csr, indptr,"
            " start_mask, dense_mask, dense_states (d=2).",
            "leaf map = our leaf_offsets (leaf -> items, for SIDs shared by several items), which STATIC has"
            " no counterpart for; not in the ratio. counts: static_layout_bytes == STATIC's real arrays.",
        ]
        print("\n".join(notes) + "\n")
        header = (
            f"{'catalog':<22}{'distinct':>11}{'ours s':>9}{'STATIC s':>10}{'speedup':>9}"
            f"{'ours bytes':>14}{'STATIC bytes':>15}{'ratio':>7}{'leaf map':>12}  counts"
        )
        print(header)
        print("-" * len(header))
        for r in in_memory:
            name = f"{r.items / 1e6:g}M L={r.steps} V={r.codebook}"
            print(
                f"{name:<22}{r.distinct_sids:>11,}{r.ours_s:>9.2f}{r.static_s:>10.2f}{r.speedup:>8.1f}x"
                f"{_mb(r.ours_bytes):>14}{_mb(r.static_bytes):>15}{r.bytes_ratio:>7.3f}"
                f"{_mb(r.leaf_map_bytes):>12}  "
                f"{'match' if r.layout_count_matches else 'MISMATCH'}"
            )
        print("\nevery run (ours and STATIC back to back, alternating which goes first)")
        for r in in_memory:
            name = f"{r.items / 1e6:g}M L={r.steps} V={r.codebook}"
            runs = "  ".join(
                f"{o:.3f}/{s:.2f}={x:.1f}x"
                for o, s, x in zip(r.ours_runs, r.static_runs, r.run_speedups, strict=True)
            )
            print(f"  {name:<20}ours s/STATIC s: {runs}   (worst {min(r.run_speedups):.1f}x)")
    if e2e is not None:
        print(f"\nend to end: python cli.py build, {e2e.items / 1e6:g}M items L={e2e.steps} V={e2e.codebook}")
        if e2e.returncode == 0:
            print(
                f"  wall {e2e.wall_s:.2f} s   {e2e.items_per_s / 1e6:.2f}M items/s   peak RSS "
                f"{_mb(e2e.peak_rss_bytes)} ({e2e.rss_per_item:.1f} bytes/item)"
            )
            timings = (e2e.summary or {}).get("timings")
            if timings:
                stages = "  ".join(f"{k} {v:.2f} s" for k, v in timings.items())
                print(f"  the CLI's own stage timings: {stages}")
        else:
            print(f"  FAILED with exit code {e2e.returncode}")
    scaled = "" if scale == 1 else "  (scaled run: not the official sizes)"
    print(f"\ntargets{scaled}")
    for r in in_memory:
        name = f"{r.items / 1e6:g}M L={r.steps} V={r.codebook}"
        print(
            f"  {_verdict(r.speedup >= TARGET_SPEEDUP)}  {name}: build >= {TARGET_SPEEDUP:g}x faster "
            f"({r.speedup:.1f}x median, runs {min(r.run_speedups):.1f}-{max(r.run_speedups):.1f}x)"
        )
        print(
            f"  {_verdict(r.bytes_ratio <= TARGET_BYTES_RATIO)}  {name}: index <= {TARGET_BYTES_RATIO:.2f}x "
            f"STATIC bytes ({r.bytes_ratio:.3f}x)"
        )
    if e2e is not None:
        ok = e2e.returncode == 0
        print(
            f"  {_verdict(ok and e2e.items_per_s >= TARGET_ITEMS_PER_S)}  end to end >= "
            f"{TARGET_ITEMS_PER_S / 1e6:g}M items/s ({e2e.items_per_s / 1e6:.2f}M)"
        )
        print(
            f"  {_verdict(ok and e2e.rss_per_item <= TARGET_RSS_PER_ITEM)}  peak RSS <= "
            f"{TARGET_RSS_PER_ITEM:g} bytes/item ({e2e.rss_per_item:.1f})"
        )


def print_scale_table(rows: list[EndToEndResult]) -> None:
    """One row per catalog size: `zerogr build` end to end, peak RSS of the build process alone."""
    print("\nend to end at scale: python cli.py build, L=4 V=2048, int64 item ids (numba cache warm)")
    header = (
        f"{'items':>12}{'wall s':>9}{'items/s':>10}{'bytes/item':>12}{'index':>13}{'leaf map':>12}  stages"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.returncode != 0:
            print(f"{r.items:>12,}  FAILED with exit code {r.returncode}")
            continue
        timings = (r.summary or {}).get("timings") or {}
        # Outside the stages: interpreter start, imports, numba's cache loads, the summary and the exit.
        timings = {**timings, "outside": r.wall_s - sum(timings.values())}
        stages = " ".join(f"{k} {v:.1f}" for k, v in timings.items())
        print(
            f"{r.items:>12,}{r.wall_s:>9.1f}{r.items_per_s / 1e6:>9.2f}M{r.rss_per_item:>12.1f}"
            f"{_mb(r.index_bytes or 0):>13}{_mb(r.leaf_map_bytes or 0):>12}  {stages}"
        )
    for r in rows:
        if r.items == max(x.items for x in rows) and r.returncode == 0:
            print(
                f"  {_verdict(r.rss_per_item <= TARGET_SCALE_RSS_PER_ITEM)}  {r.items / 1e6:g}M: peak RSS <= "
                f"{TARGET_SCALE_RSS_PER_ITEM:g} bytes/item ({r.rss_per_item:.1f})"
            )
            print(
                f"  {_verdict(r.items_per_s >= TARGET_SCALE_ITEMS_PER_S)}  {r.items / 1e6:g}M: >= "
                f"{TARGET_SCALE_ITEMS_PER_S / 1e6:g}M items/s ({r.items_per_s / 1e6:.2f}M)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scale",
        nargs="?",
        const="rows",
        default="1",
        help="a number multiplies every catalog size (quick runs); bare --scale adds the 50M/100M rows",
    )
    parser.add_argument(
        "--scale-items",
        default=",".join(map(str, SCALE_ITEMS)),
        help="catalog sizes of the bare --scale table (comma-separated)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="interleaved runs of each in-memory build (ours and STATIC alternate; medians reported)",
    )
    parser.add_argument("--skip-e2e", action="store_true", help="in-memory comparison only")
    parser.add_argument("--only-e2e", action="store_true", help="end-to-end build only")
    parser.add_argument("--e2e-steps", type=int, default=4, help="SID length of the end-to-end catalog")
    parser.add_argument("--e2e-codebook", type=int, default=2048, help="codebook size, end-to-end catalog")
    parser.add_argument("--workdir", type=Path, default=None, help="where the e2e catalog goes (default tmp)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--cold-items",
        type=int,
        default=1_000_000,
        help="with bare --scale: catalog size of the cold first-run row (0 skips it)",
    )
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir = args.workdir.resolve()  # the timed builds run in another working dir
    scale_rows = args.scale == "rows"
    args.scale = 1.0 if scale_rows else float(args.scale)

    shapes = [(max(1000, int(n * args.scale)), steps, v) for n, steps, v in IN_MEMORY_CATALOGS]
    in_memory: list[InMemoryResult] = []
    if not args.only_e2e:
        warm_up(shapes)
        for items, steps, codebook in shapes:
            print(f"in-memory: {items:,} items L={steps} V={codebook} ...", file=sys.stderr, flush=True)
            in_memory.append(bench_in_memory(items, steps, codebook, args.repeats))
    e2e = None
    if not args.skip_e2e:
        items = max(1000, int(E2E_ITEMS * args.scale))
        print(f"end to end: {items:,} items ...", file=sys.stderr, flush=True)
        own_dir = args.workdir is None
        workdir = Path(tempfile.mkdtemp(prefix="zerogr_bench_")) if own_dir else args.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            e2e = bench_end_to_end(items, args.e2e_steps, args.e2e_codebook, workdir)
        finally:
            if own_dir:
                shutil.rmtree(workdir, ignore_errors=True)
    print_report(in_memory, e2e, args.scale)
    scale_results: list[EndToEndResult] = []
    if scale_rows:
        workdir = args.workdir or Path(tempfile.gettempdir()) / "zerogr_bench_scale"
        workdir.mkdir(parents=True, exist_ok=True)  # kept: catalogs this size are worth reusing
        for items in (int(x) for x in args.scale_items.split(",")):
            print(f"end to end at scale: {items:,} items ...", file=sys.stderr, flush=True)
            scale_results.append(bench_end_to_end(items, 4, 2048, workdir))
        print_scale_table(scale_results)
    cold = None
    if scale_rows and args.cold_items > 0:
        print(f"cold first run: {args.cold_items:,} items ...", file=sys.stderr, flush=True)
        cold = bench_cold_first_run(args.cold_items, workdir)
        print_cold(cold)
    if args.json is not None:
        payload = {
            "scale_factor": args.scale,
            "in_memory": [
                asdict(r)
                | {
                    "ours_s": r.ours_s,
                    "static_s": r.static_s,
                    "speedup": r.speedup,
                    "run_speedups": r.run_speedups,
                    "bytes_ratio": r.bytes_ratio,
                }
                for r in in_memory
            ],
            "end_to_end": None
            if e2e is None
            else asdict(e2e) | {"items_per_s": e2e.items_per_s, "rss_per_item": e2e.rss_per_item},
            "scale": [
                asdict(r)
                | {
                    "items_per_s": r.items_per_s,
                    "rss_per_item": r.rss_per_item,
                    "index_bytes": r.index_bytes,
                    "leaf_map_bytes": r.leaf_map_bytes,
                }
                for r in scale_results
            ],
            "cold_first_run": None if cold is None else asdict(cold),
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
