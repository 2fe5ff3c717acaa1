"""Which scoring mode a step uses: the tuned plan's choice, else a documented heuristic.

A plan is what `zerogr tune` measured on one device class, stored in the bundle as plans/<device-key>.json
(format: docs/bundle-format.md, section 11). `load_plan` reads and validates one, `find_plan` finds the one of
a device in a bundle, `Plan.mode_for` answers the Decoder's question for (step, batch size, dtype):

  - lookup: the entries of that step and dtype, the one whose batch size is nearest in log scale (ties go
    to the larger batch); no entry -> no plan answer. If the planned mode is not available on this device
    (e.g. the kernel backend failed to load), the fastest *available* mode in the entry's `timings_ms`.
  - heuristic (no plan, no entry, or nothing available): dense steps, the score-first order and the
    unconstrained order -> "full": all V_t logits are needed anyway (slot k is token k at a dense step;
    score-first normalises over all V_t), so one GEMM is the cheapest way to get them.
    Sparse steps under filter-first on CPU with the numba kernel -> "selective_numba" when a row has at
    most CPU_KERNEL_MAX_SHARE * V_t children on average (the table's nnz / rows; the slot cap K when not
    given), else "full". The kernel computes only valid slots (work per beam: its row's children) and
    fuses the log-softmax; "full" pays V_t multiply-adds per beam plus a gather and a log-softmax over K
    slots. scripts/bench_cpu_sweep.py found the kernel's step faster at every density it measured on the
    2-core reference machine, up to 0.88 V_t children per row, so the threshold is the density at which
    the build stores a step dense anyway (FormatPolicy: 0.9). A faster GEMM (more cores, AVX-512, AMX)
    moves the crossover down: `zerogr tune` measures it.
    Other sparse steps under filter-first -> a selective mode when the slot cap K is small against V_t:
    K * 32 <= V_t on CPU (torch's gathered dot product costs several GEMM flops there), K * 8 <= V_t on
    CUDA; "selective_cuda" when that backend is available, else "selective"; otherwise "full".

`ModeChooser` combines the two for a Decoder and warns once per step when the plan cannot be followed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..base.device import device_info, device_key
from ..base.dtypes import DTYPE_NAMES, dtype_name
from ..base.errors import BundleError, InputError
from ..base.printable import printable
from ..base.small_files import read_small_json

PLAN_FORMAT = "zerogr-plan"
PLAN_FORMAT_VERSION = 1
MAX_PLAN_BYTES = 16 << 20  # far above any real plan; a bigger file is refused unread


@dataclass(frozen=True)
class PlanEntry:
    """One measurement: at `step`, `batch_size` requests, weights of `dtype`, `mode` was fastest.
    timings_ms: median ms of every mode timed ({} when the plan did not record them)."""

    step: int
    batch_size: int
    dtype: str
    mode: str
    timings_ms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A validated plan. data: the whole document as read (what tune wrote); path: its file, if any."""

    entries: tuple[PlanEntry, ...]
    device_key: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    path: Path | None = None

    def mode_for(
        self, step: int, batch_size: int, dtype: Any, available: Sequence[str] | None = None
    ) -> str | None:
        """The planned mode of the entry of `step` and `dtype` at the batch size nearest to `batch_size`
        (log scale, ties to the larger). With `available`: that mode if it is available, else the fastest
        available mode of the entry's timings; None when the plan has nothing (usable) for this step."""
        want = dtype_name(dtype)
        target = max(batch_size, 1)
        chosen: PlanEntry | None = None
        best: tuple[Fraction, int] | None = None
        for entry in self.entries:
            if entry.step != step or entry.dtype != want:
                continue
            # Distance on a log scale is the ratio of the larger to the smaller size; exact, so that a
            # batch at the geometric mean of two entries is a true tie (floats would pick by rounding).
            ratio = Fraction(max(entry.batch_size, target), min(entry.batch_size, target))
            key = (ratio, -entry.batch_size)
            if best is None or key < best:
                best, chosen = key, entry
        if chosen is None:
            return None
        if available is None or chosen.mode in available:
            return chosen.mode
        usable = {m: t for m, t in chosen.timings_ms.items() if m in available}
        return min(usable, key=usable.__getitem__) if usable else None


# ------------------------------------------------------------------------------------------ reading


def load_plan(
    source: Plan | Mapping[str, Any] | Sequence[Mapping[str, Any]] | str | Path,
    *,
    expect_key: str | None = None,
) -> Plan:
    """A validated Plan from a plan file (str / Path), a plan document (dict) or a bare list of entries.

    A file must be a whole plan document (docs/bundle-format.md, section 11), with `device_key` equal to
    `expect_key` when given; BundleError naming the file and the first broken rule otherwise. An
    in-memory dict needs only `entries` (`format`, `format_version` and `device_key` are checked when
    present); InputError for a broken in-memory plan."""
    if isinstance(source, Plan):
        return source
    if isinstance(source, (str, Path)):
        path = Path(source)
        return _validate(
            read_small_json(path, MAX_PLAN_BYTES, "plan", BundleError),
            str(path),
            BundleError,
            whole=True,
            path=path,
            key=expect_key,
        )
    if isinstance(source, Mapping):
        return _validate(source, "plan", InputError, whole=False)
    if isinstance(source, Sequence):
        return _validate({"entries": list(source)}, "plan", InputError, whole=False)
    raise InputError(f"plan must be a dict, a list of entries or a JSON path, got {type(source).__name__}")


def find_plan(bundle: Any, device: Any) -> Plan | None:
    """The plan measured on this device's class (same device_key) in an opened Bundle, or None when the
    bundle has none. BundleError naming the file when it has one that breaks the format."""
    key = device_key(str(device))
    name = bundle.plans().get(key)
    return None if name is None else load_plan(bundle.file(name), expect_key=key)


#: What a Decoder without a usable plan does instead (the rules in this module's docstring).
HEURISTIC_FALLBACK = "the heuristic mode choice for every step (the same results; the speed untuned)"


def auto_plan(bundle: Any, device: Any) -> Plan | None:
    """plan="auto": the bundle's plan for this device, or None with one warning saying why - never an
    error. See `resolve_auto_plan`."""
    return resolve_auto_plan(bundle, device)[0]


def resolve_auto_plan(bundle: Any, device: Any) -> tuple[Plan | None, str | None]:
    """plan="auto": (the bundle's plan for this device, None), or (None, why not) with one warning that
    says why and what the Decoder does instead: no bundle, a plan file that breaks the format (named), or
    no plan for this device, with what differs from each plan the bundle has (device type, model,
    architecture, CPU thread count). Never an error."""
    if bundle is None:
        reason = "plan='auto' needs a Bundle"
    else:
        try:
            found = find_plan(bundle, device)
        except BundleError as exc:
            found, reason = None, f"plan='auto': ignoring a broken plan: {exc}"
        else:
            reason = None if found is not None else f"plan='auto': {no_plan_reason(bundle, device)}"
        if found is not None:
            return found, None
    message = f"{reason}; using {HEURISTIC_FALLBACK}"
    warnings.warn(message, stacklevel=3)
    return None, message


#: The fields of a plan's `device` record that decide its device key (base.device.device_key), with what a
#: message calls them.
_KEY_FIELDS = (("type", "device type"), ("name", "model"), ("arch", "architecture"), ("threads", "threads"))


def no_plan_reason(bundle: Any, device: Any) -> str:
    """Why the bundle has no plan for `device`: this device's key, and for each plan in the bundle (at most
    4 named) what differs from this device: e.g. "cpu-x86-64-epyc-2t: measured with 2 CPU threads, this
    process computes with 1 (torch.set_num_threads(2), or tune with 1)". A plan's device record is
    informational and untrusted: quoted short and escaped, and a plan without one is told apart by key."""
    info = device_info(str(device))
    key = device_key(info)
    plans = sorted(bundle.plans())
    if not plans:
        return f"the bundle has no plan (this device is {key}; `zerogr tune` writes one)"
    diffs = []
    for other in plans[:4]:
        try:
            recorded = load_plan(bundle.file(bundle.plans()[other]), expect_key=other).data.get("device")
        except (BundleError, OSError):
            recorded = None
        diffs.append(f"{_short(other)}: {_device_difference(recorded, info)}")
    more = f"; and {len(plans) - 4} more" if len(plans) > 4 else ""
    return f"no plan for this device ({key}) in the bundle; its plans: {'; '.join(diffs)}{more}"


def _device_difference(recorded: Any, info: Mapping[str, Any]) -> str:
    """What differs between a plan's recorded device and this one, in words."""
    if not isinstance(recorded, Mapping):
        return "another device class (the plan records no device)"
    differs = [
        (word, recorded.get(f), info.get(f)) for f, word in _KEY_FIELDS if recorded.get(f) != info.get(f)
    ]
    if not differs:
        return "another device class"
    if recorded.get("type") != info.get("type"):
        return (
            f"measured on {_short(recorded.get('type'))} ({_short(recorded.get('name'))}), this process "
            f"runs on {info.get('type')} ({_short(info.get('name'))})"
        )
    words = []
    for word, had, has in differs:
        if word == "threads":
            words.append(
                f"measured with {_short(had)} CPU threads, this process computes with {has} "
                f"(torch.set_num_threads({_short(had)}) before loading, or tune with {has} threads)"
            )
        else:
            words.append(f"{word} {_short(had)} (this device: {_short(has)})")
    return ", ".join(words)


def _short(value: Any, limit: int = 60) -> str:
    text = printable(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validate(
    data: Any,
    where: str,
    error: type[Exception],
    *,
    whole: bool,
    path: Path | None = None,
    key: str | None = None,
) -> Plan:
    """Every rule of the plan format, in order; the first broken one raises `error` naming `where`."""

    def fail(rule: str) -> Exception:
        return error(f"{where}: {rule}")

    if not isinstance(data, Mapping):
        raise fail(f"a plan must be a JSON object, got {type(data).__name__}")
    for name, want in (("format", PLAN_FORMAT), ("format_version", PLAN_FORMAT_VERSION)):
        if name in data or whole:
            got = data.get(name)
            if type(got) is not type(want) or got != want:
                raise fail(f"{name} must be {want!r}, got {got!r} (not a zerogr plan of this version)")
    got_key = data.get("device_key")
    if (got_key is not None or whole) and not (isinstance(got_key, str) and got_key):
        raise fail(f"device_key must be a non-empty string, got {got_key!r}")
    if key is not None and got_key != key:
        raise fail(f"device_key {got_key!r} differs from the file name's {key!r}")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise fail(f"entries must be a list, got {type(entries).__name__}")
    parsed = tuple(_entry(e, i, fail) for i, e in enumerate(entries))
    seen: set[tuple[int, int, str]] = set()
    for i, e in enumerate(parsed):
        if (e.step, e.batch_size, e.dtype) in seen:
            raise fail(
                f"entries[{i}]: a second entry for step {e.step}, batch_size {e.batch_size}, {e.dtype}"
            )
        seen.add((e.step, e.batch_size, e.dtype))
    return Plan(parsed, got_key, dict(data), path)


def _entry(entry: Any, i: int, fail: Any) -> PlanEntry:
    at = f"entries[{i}]"
    if not isinstance(entry, Mapping):
        raise fail(f"{at} must be an object, got {type(entry).__name__}")
    for name, low in (("step", 0), ("batch_size", 1)):
        value = entry.get(name)
        if type(value) is not int or value < low:
            raise fail(f"{at}: {name} must be an integer >= {low}, got {value!r}")
    dtype, mode, timings = entry.get("dtype"), entry.get("mode"), entry.get("timings_ms", {})
    if dtype not in DTYPE_NAMES:
        raise fail(f"{at}: dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    if not (isinstance(mode, str) and mode):
        raise fail(f"{at}: mode must be a non-empty string, got {mode!r}")
    if not isinstance(timings, Mapping) or not all(
        isinstance(m, str) and type(t) in (int, float) and math.isfinite(t) and t >= 0
        for m, t in timings.items()
    ):
        raise fail(f"{at}: timings_ms must map mode names to finite numbers >= 0")
    timings = {m: float(t) for m, t in timings.items()}
    return PlanEntry(entry["step"], entry["batch_size"], dtype, mode, timings)


# ------------------------------------------------------------------------------------------ choosing


CPU_KERNEL_MAX_SHARE = 0.9
"""Densest rows (children / V_t) at which the CPU heuristic still picks the numba kernel over the GEMM."""


def heuristic_mode(
    *,
    step_format: str,
    cap: int,
    codebook_size: int,
    order: str,
    device_type: str,
    available: Sequence[str],
    mean_children: float | None = None,
) -> str:
    """Mode for a step without a plan (rules in the module docstring). mean_children: the step table's
    children per row (nnz / rows); None bounds it by the cap."""
    if step_format == "dense" or order != "filter_first":
        return "full"
    if device_type == "cpu" and "selective_numba" in available:
        children = cap if mean_children is None else mean_children
        return "selective_numba" if children <= CPU_KERNEL_MAX_SHARE * codebook_size else "full"
    ratio = 8 if device_type == "cuda" else 32
    if cap * ratio > codebook_size:
        return "full"
    return "selective_cuda" if "selective_cuda" in available else "selective"


class ModeChooser:
    """A Decoder's mode choice without an explicit mode: the plan (nearest batch), else the heuristic.
    Warns once per (step, reason) when there is a plan that cannot be followed."""

    def __init__(self, plan: Plan | None, available: Sequence[str], device_type: str) -> None:
        self.plan = plan
        self.available = list(available)
        self.device_type = device_type
        self._warned: set[tuple[int, str]] = set()

    def choose(
        self,
        step: int,
        batch_size: int,
        dtype: Any,
        *,
        step_format: str,
        cap: int,
        codebook_size: int,
        order: str,
        mean_children: float | None = None,
    ) -> str:
        """The mode of `step` for `batch_size` requests with weights of `dtype` (see the module docstring)."""
        if self.plan is not None:
            planned = self.plan.mode_for(step, batch_size, dtype, self.available)
            if planned is not None:
                return planned
            wanted = self.plan.mode_for(step, batch_size, dtype)
            if wanted is None:
                name = dtype_name(dtype)
                self._warn(step, name, self._no_entry(step, name))
            else:
                self._warn(step, wanted, f"plan mode {wanted!r} for step {step} unavailable here")
        return heuristic_mode(
            step_format=step_format, cap=cap, codebook_size=codebook_size, order=order,
            device_type=self.device_type, available=self.available, mean_children=mean_children,
        )  # fmt: skip

    def _no_entry(self, step: int, dtype: str) -> str:
        assert self.plan is not None
        measured = sorted({e.dtype for e in self.plan.entries if e.step == step})
        if measured:
            return (
                f"the plan has no entry for step {step} at {dtype}: it measured {', '.join(measured)} "
                f"(the weights are {dtype}; tune with --dtypes {dtype})"
            )
        return f"the plan has no entry for step {step} (at any dtype)"

    def _warn(self, step: int, what: str, message: str) -> None:
        if (step, what) not in self._warned:
            self._warned.add((step, what))
            warnings.warn(f"{message}; using the heuristic mode choice for step {step}", stacklevel=5)


__all__ = [
    "PLAN_FORMAT",
    "PLAN_FORMAT_VERSION",
    "ModeChooser",
    "Plan",
    "PlanEntry",
    "auto_plan",
    "find_plan",
    "heuristic_mode",
    "load_plan",
    "no_plan_reason",
    "resolve_auto_plan",
]
