"""`--metrics-file PATH`: Prometheus text format for batch jobs (node_exporter's textfile-collector
convention), rendered by prometheus-client and written atomically when the command ends, successful or
not; only ever over a regular file (a device, FIFO, socket, directory or symlink at PATH is left as it is).

Every command that takes `--metrics-file` writes one file per run with these series (label `job` = the
command, e.g. `build`):

    zerogr_job_last_run_timestamp_seconds       when this run ended (unix seconds)
    zerogr_job_last_success_timestamp_seconds   when the last successful run ended; a failed run carries
                                                over the value already in the file (absent: never)
    zerogr_job_exit_status                      this run's exit code (0 ok, 2 bad input, ...)
    zerogr_job_consecutive_failures             runs in a row, this one included, that exited non-zero
                                                (0 after a success; carried over from the file)
    zerogr_job_duration_seconds                 this run's wall time
    zerogr_job_stage_duration_seconds{stage}    wall time per stage (read, build, publish, upload, ...)
    zerogr_bundle_items / _distinct_sids / _index_bytes / _version
                                                what the run produced or handled, where it knows them
    zerogr_bundle_remote_version                push: the fleet's number for the version pushed
    zerogr_fleet_metadata_expires_timestamp_seconds / zerogr_fleet_latest_version
                                                the fleet's signed metadata: when its timestamp expires,
                                                and the version it names as LATEST (push, pull, status,
                                                rebuild, promote of a remote version)
    zerogr_fleet_latest_seen_timestamp_seconds  when that LATEST was read off the fleet. A run that read
                                                no fleet metadata (it failed, was refused, or is running)
                                                carries the three over from the file it replaces: the
                                                job's last known view of the fleet never goes missing
    zerogr_<job>_<name>                         a command's own gauges (pull: held; promote of a remote
                                                version: previous_version), some labelled (rebuild:
                                                guard_fired{guard})
    zerogr_job_running, _start_timestamp_seconds, zerogr_job_run_info{run_id}
                                                a command that reports its runs (rebuild): the file is
                                                also written as the run starts (write_start), running 1
                                                and no exit status, so a killed run shows as started and
                                                never finished

Usage in a command (outside `cli_errors()`, so it sees the exit code that block chose):

    with job_metrics("build", metrics_file) as metrics, cli_errors():
        with metrics.stage("read"):
            ...
        metrics.bundle(items=..., distinct_sids=..., index_bytes=..., version=...)
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import typer

from ..base.numbers import finite
from ..base.printable import safe_text
from ._early_metrics import CONSECUTIVE_FAILURES, FLEET_GAUGES, LAST_SUCCESS, PREFIX
from ._signals import Received, interrupt_exit_code, run_ended, signal_name, signals_as_interrupts

BUNDLE_GAUGES = {
    "items": "Items in the bundle's catalog.",
    "distinct_sids": "Distinct SIDs (leaves) in the bundle.",
    "index_bytes": "Bytes of the bundle's step tables.",
    "version": "The bundle version number the run produced or handled.",
    "shared_sid_items_ratio": "Share of the bundle's items whose SID names another item too.",
    "remote_version": "The fleet's number for the version a push published (the same as version, except "
    "for versions pushed before the numbers were one).",
}
#: The mode of every metrics file, whatever the umask: node_exporter runs as another user.
METRICS_FILE_MODE = 0o644


class JobMetrics:
    """What one run of one command measured; `write(exit_status)` puts it in the metrics file."""

    def __init__(self, job: str, path: str | os.PathLike | None) -> None:
        self.job = job
        self.path = None if path is None else Path(path)
        self.started = time.time()
        self.stages: dict[str, float] = {}
        self.values: dict[str, float] = {}
        self.failure: tuple[str, str] | None = None  # (stage, one-line reason) of a failed run
        self.own: dict[str, tuple[str, float]] = {}  # the command's own gauges: name -> (help, value)
        # the command's own labelled gauges: name -> (help, {sorted label items: value})
        self.labelled: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}
        self.run_id: str | None = None  # set by write_start: the run is reported as running, then ended
        self.fleet_values: dict[str, float] = {}

    def fail(self, stage: str, reason: str) -> None:
        """Name what failed: written as zerogr_job_failure_info{stage, reason} 1 when the run fails."""
        self.failure = (stage, safe_text(" ".join(reason.split()))[:300])

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage; a stage entered twice adds up."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - t0

    def add_stage(self, name: str, seconds: float) -> None:
        """Record a stage timed elsewhere (e.g. the library's own per-stage timings)."""
        self.stages[name] = self.stages.get(name, 0.0) + float(seconds)

    def add_stages(self, timings: Mapping[str, float]) -> None:
        """Record every stage of a {stage: seconds} dict the library timed."""
        for stage, seconds in timings.items():
            self.add_stage(stage, seconds)

    def job_value(self, name: str, doc: str, value: float) -> None:
        """Record a gauge of the command's own, written as zerogr_<job>_<name>{job} (zerogr_pull_held)."""
        number = finite(int(value) if isinstance(value, bool) else value)
        if number is not None:
            self.own[name] = (doc, number)

    def fleet(self, *, expires: float | None = None, latest: int | None = None) -> None:
        """Record what the fleet's signed metadata says: when its timestamp expires, and the version it
        names as LATEST (None = unknown)."""
        for name, value in (("metadata_expires_timestamp_seconds", expires), ("latest_version", latest)):
            number = finite(value)
            if number is not None:
                self.fleet_values[name] = number
                if name == "latest_version":
                    self.fleet_values["latest_seen_timestamp_seconds"] = time.time()

    def job_labelled(self, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        """Record one series of a labelled gauge of the command's own: zerogr_<job>_<name>{job, labels}
        (e.g. zerogr_rebuild_guard_fired{guard="items_ratio"})."""
        series = self.labelled.setdefault(name, (doc, {}))[1]
        series[tuple(sorted((k, safe_text(v)[:300]) for k, v in labels.items()))] = float(value)

    def write_start(self, run_id: str) -> None:
        """Write the file as the run starts: zerogr_job_running 1, the start time and run id, the last
        success carried over, no exit status. A run killed before its end (kill -9) leaves exactly this;
        `write` at the end says running 0 beside the exit status. No-op without a path."""
        self.run_id = run_id
        if self.path is not None:
            self._write(None)

    def bundle_from_manifest(self, manifest: Mapping[str, Any], version: int) -> None:
        """Record the bundle facts a (validated) manifest states, for the version the run handled."""
        self.bundle(
            items=manifest["leaves"]["items"],
            distinct_sids=manifest["leaves"]["count"],
            index_bytes=manifest.get("index_bytes"),
            version=version,
        )

    def bundle(self, **values: float | int | None) -> None:
        """Record bundle facts: any of items, distinct_sids, index_bytes, version (None, or anything that
        is not a finite number, = unknown)."""
        for name, value in values.items():
            if name not in BUNDLE_GAUGES:
                raise ValueError(f"unknown bundle metric {name!r}; known: {', '.join(BUNDLE_GAUGES)}")
            # Values can come from a manifest read off a remote store: anything but a finite real number
            # is left out, never allowed to fail the command it only describes.
            number = finite(value)
            if number is not None:
                self.values[name] = number

    def write(self, exit_status: int) -> None:
        """Write the file atomically (a temp file in the same dir, then a rename). No-op without a path."""
        if self.path is None:
            return
        self._write(exit_status)

    def _write(self, exit_status: int | None) -> None:
        """The file at the end of the run (exit_status), or as it starts (None: write_start)."""
        from prometheus_client import CollectorRegistry, Gauge, generate_latest

        assert self.path is not None
        now = time.time()
        registry = CollectorRegistry()
        labels = ["job"]

        def gauge(name: str, doc: str, value: float, extra: dict[str, str] | None = None) -> None:
            g = Gauge(name, doc, labels + sorted(extra or {}), registry=registry)
            g.labels(job=self.job, **(extra or {})).set(value)

        if self.run_id is not None:
            gauge(
                f"{PREFIX}_job_running", "1 while a run is under way (0 once it ended).", exit_status is None
            )
            gauge(
                f"{PREFIX}_job_start_timestamp_seconds", "When the current or last run started.", self.started
            )
            gauge(f"{PREFIX}_job_run_info", "The current or last run's id.", 1, {"run_id": self.run_id})
        previous = previous_values(self.path, self.job)
        fleet = {**fleet_view(previous), **self.fleet_values}  # what this run read replaces the carried
        failures_doc = "Runs in a row, the last one included, that exited non-zero (0 after a success)."
        if exit_status is None:
            last_success = previous.get(LAST_SUCCESS)
            if last_success is not None:
                gauge(LAST_SUCCESS, "When the last successful run ended (unix seconds).", last_success)
            gauge(CONSECUTIVE_FAILURES, failures_doc, previous.get(CONSECUTIVE_FAILURES, 0.0))
            # What LATEST served when the last run ended: still true while this one runs (or was killed).
            for name, doc in BUNDLE_GAUGES.items():
                if f"{PREFIX}_bundle_{name}" in previous:
                    gauge(f"{PREFIX}_bundle_{name}", doc, previous[f"{PREFIX}_bundle_{name}"])
            for name, value in fleet.items():
                gauge(f"{PREFIX}_fleet_{name}", FLEET_GAUGES[name], value)
            replace_regular_file(self.path, generate_latest(registry))
            return
        gauge(f"{PREFIX}_job_last_run_timestamp_seconds", "When the last run ended (unix seconds).", now)
        last_success = now if exit_status == 0 else previous.get(LAST_SUCCESS)
        if last_success is not None:
            gauge(LAST_SUCCESS, "When the last successful run ended (unix seconds).", last_success)
        gauge(f"{PREFIX}_job_exit_status", "Exit code of the last run (0 = ok).", exit_status)
        failures = 0.0 if exit_status == 0 else previous.get(CONSECUTIVE_FAILURES, 0.0) + 1
        gauge(CONSECUTIVE_FAILURES, failures_doc, failures)
        gauge(f"{PREFIX}_job_duration_seconds", "Wall time of the last run.", now - self.started)
        if exit_status != 0 and self.failure is not None:
            stage, reason = self.failure
            gauge(
                f"{PREFIX}_job_failure_info",
                "What failed in the last run.",
                1,
                {"stage": stage, "reason": reason},
            )
        if self.stages:
            g = Gauge(
                f"{PREFIX}_job_stage_duration_seconds", "Wall time per stage of the last run.",
                ["job", "stage"], registry=registry,
            )  # fmt: skip
            for stage, seconds in self.stages.items():
                g.labels(job=self.job, stage=stage).set(seconds)
        for name, value in self.values.items():
            gauge(f"{PREFIX}_bundle_{name}", BUNDLE_GAUGES[name], value)
        for name, value in fleet.items():
            gauge(f"{PREFIX}_fleet_{name}", FLEET_GAUGES[name], value)
        for name, (doc, value) in self.own.items():
            gauge(f"{PREFIX}_{self.job}_{name}", doc, value)
        for name, (doc, series) in self.labelled.items():
            names = sorted({k for key in series for k, _ in key})
            g = Gauge(f"{PREFIX}_{self.job}_{name}", doc, ["job", *names], registry=registry)
            for key, value in series.items():
                g.labels(job=self.job, **dict(key)).set(value)
        replace_regular_file(self.path, generate_latest(registry))


class NotARegularFile(OSError):
    """The metrics path names something other than a regular file: it is left as it is."""


def replace_regular_file(path: Path, data: bytes) -> None:
    """Replace the regular file `path` (or create it) with `data`, atomically (a temp file created with
    O_EXCL beside it, fsync, rename). Anything else at `path` (checked with lstat: a symlink, a directory,
    a device, a FIFO or a socket) is never replaced: NotARegularFile, so `--metrics-file /dev/null` run as
    root leaves /dev/null a device. The file gets mode 644 whatever the umask (a systemd unit's
    UMask=0077 included): node_exporter, another user, reads it."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise NotARegularFile(f"it is {_kind_of(mode)}, not a regular file; left as it is")
    from ..bundle.files import atomic_replace_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_replace_bytes(path, data, mode=METRICS_FILE_MODE)


def _kind_of(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
    )  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "a special file")


def previous_success(path: Path, job: str) -> float | None:
    """The last-success timestamp already in the file for this job, if the file parses; else None."""
    return previous_values(path, job).get(LAST_SUCCESS)


def previous_values(path: Path, job: str) -> dict[str, float]:
    """{metric name: value} of the file's unlabelled series for this job (only `job` as label), finite
    values only; {} when the file is missing, over 1 MiB, or does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            return {}
        text = path.read_text(encoding="utf-8")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels == {"job": job} and math.isfinite(sample.value):
                    values[sample.name] = sample.value
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return values


def fleet_view(values: Mapping[str, float]) -> dict[str, float]:
    """The zerogr_fleet_* gauges of previous_values(...) as {name: value}, the LATEST seen kept only
    with the time it was seen (a view without it cannot be ordered against the others)."""
    view = {
        name: values[f"{PREFIX}_fleet_{name}"] for name in FLEET_GAUGES if f"{PREFIX}_fleet_{name}" in values
    }
    if "latest_seen_timestamp_seconds" not in view:
        view.pop("latest_version", None)
    return view


def bundle_facts(path: str | os.PathLike) -> dict[str, float]:
    """The zerogr_bundle_* values of a metrics file another command wrote ({} when it is missing or does
    not parse), e.g. {"items": 20000.0, "version": 7.0}."""
    from prometheus_client.parser import text_string_to_metric_families

    facts: dict[str, float] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removeprefix(f"{PREFIX}_bundle_")
                if name in BUNDLE_GAUGES and math.isfinite(sample.value):
                    facts[name] = sample.value
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return facts


@contextlib.contextmanager
def job_metrics(job: str, path: str | os.PathLike | None) -> Iterator[JobMetrics]:
    """Yield a JobMetrics and write it when the block ends: exit status 0, the typer Exit code, 130
    on Ctrl-C, 128 + N on signal N (SIGTERM and SIGHUP end the block like Ctrl-C), 1 on any other
    exception. A signal that reached the block, wherever it was raised (the command's imports, before its
    cli_errors(); a library that turned it into another error or swallowed it), ends it with 128 + N and
    the one line `zerogr: terminated by SIGTERM` on stderr (written here unless cli_errors wrote it), the
    same status as the file. A command that does not end within the grace period after SIGTERM or SIGHUP
    (stuck in native code) has the file written with 128 + N by the signal watchdog (cli/_signals.py) as
    it is ended. A metrics file that cannot be written is one warning line on stderr; it never changes the
    command's own exit code. The file is written once per run; from then on a signal no longer changes
    the process's exit status (cli/_signals.py's run_ended)."""
    metrics = JobMetrics(job, path)
    status = 1
    lock, written = threading.Lock(), []

    def write_once(exit_status: int) -> None:
        with lock:  # the watchdog waits for a write under way, then skips it
            if written:
                return
            written.append(exit_status)
            try:
                metrics.write(exit_status)
            except OSError as exc:
                _say(f"WARNING: could not write the metrics file {metrics.path}: {exc}")
            run_ended(exit_status)  # a signal from now on ends the process with this status

    def forced_exit(signum: int) -> None:
        metrics.fail("signal", f"terminated by {signal_name(signum)}; ended after the grace period")
        write_once(128 + signum)

    def terminated(signum: int) -> typer.Exit:
        """The end of a block a signal reached but that came out otherwise: 128 + N and its line."""
        nonlocal status
        status = 128 + signum
        metrics.fail("signal", f"terminated by {signal_name(signum)}")
        _say(f"zerogr: terminated by {signal_name(signum)}")
        return typer.Exit(status)

    received = Received()
    try:
        with signals_as_interrupts(forced_exit) as received:
            yield metrics
    except typer.Exit as exc:
        status = int(exc.exit_code or 0)
        if received.signum is not None and status != 128 + received.signum:
            raise terminated(received.signum) from None
        if status > 128 and metrics.failure is None:
            metrics.fail("signal", f"terminated by {signal_name(status - 128)}")
        raise
    except KeyboardInterrupt as exc:
        # Raised outside the command's cli_errors() (which would have made it a typer Exit): the same line
        # and code here, never typer's bare exit 130 for any KeyboardInterrupt.
        status = interrupt_exit_code(exc)
        metrics.fail("signal", str(exc) or "interrupted")
        if os.environ.get("ZEROGR_DEBUG"):
            import traceback

            traceback.print_exc()
        _say(f"zerogr: {safe_text(exc or 'interrupted')}")
        raise typer.Exit(status) from None
    except Exception:
        if received.signum is not None:
            raise terminated(received.signum) from None
        raise
    else:
        status = 0
        if received.signum is not None:  # swallowed by a library on the way: the signal still ends the run
            raise terminated(received.signum)
    finally:
        write_once(status)


def _say(line: str) -> None:
    """One line on stderr, never an error of its own (a closed stderr)."""
    import sys

    with contextlib.suppress(Exception):
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
