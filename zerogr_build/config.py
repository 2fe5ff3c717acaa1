"""Build and tune settings: defaults (in code, so an installed package needs no checkout), a TOML file, CLI
overrides.

Precedence: dataclass defaults < `[build]` / `[tune]` / `[guards]` table of the config file < CLI flags.
The packaged zerogr_build/configs/default.toml (`zerogr config --show-defaults`) lists every key with its
default (a test keeps the two in step). TOML has no null, so
"not set" is spelled as an empty value: sid_columns = [] (use sid_column), codebook_sizes = [] (not set: a
build refuses to run; "infer" asks for max token + 1 per step), workers = 0 (all cores), keep = 0 (keep
every version), model_version = "", device = "" (tune).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base.device import parse_device
from .base.dtypes import DTYPE_NAMES
from .base.errors import InputError
from .base.small_files import read_small_toml
from .cuda.nvcc import parse_kernel_archs

if TYPE_CHECKING:
    from .bundle.guards import GuardThresholds

#: The packaged config listing every key with its default (`zerogr config --show-defaults`).
DEFAULT_CONFIG_RESOURCE = "configs/default.toml"


def default_config_text() -> str:
    """The text of the packaged default config (every [build] and [tune] key with its default)."""
    from importlib.resources import files

    return files(__package__).joinpath(DEFAULT_CONFIG_RESOURCE).read_text(encoding="utf-8")


#: Tables a config file may hold.
KNOWN_TABLES = frozenset({"build", "tune", "guards", "fleet"})
MAX_CONFIG_BYTES = 1 << 20
_INT_RE = re.compile(r"[+-]?[0-9]+")
#: Where `zerogr build` runs: in this process, or partitioned on a Ray cluster.
ENGINES = ("local", "ray")
#: codebook_sizes = "infer" (or `zerogr build --infer-codebook-sizes`): max token + 1 per step, by choice.
INFER_CODEBOOK_SIZES = "infer"


@dataclass(frozen=True)
class BuildSettings:
    """Every option of `zerogr build` (each has a CLI flag and a key in the default config)."""

    out: str = "bundles"
    """OUT dir: versions are published under it, LATEST names the newest."""
    sid_column: str = "sid"
    """List (or fixed-size list) column holding each item's SID."""
    sid_columns: tuple[str, ...] = ()
    """L integer columns holding the SID tokens instead (empty: use sid_column)."""
    item_column: str = "item_id"
    """Item id column (integer or string; kept as its type)."""
    codebook_sizes: tuple[int, ...] | str = ()
    """V_t per step, or "infer" (max token + 1 per step, an explicit choice); empty: not set, and a build
    refuses to run (pipeline.build_bundle), so a forgotten option cannot slip through."""
    workers: int = 0
    """CPU threads for the index build (0: all cores)."""
    step_formats: str = "auto"
    """auto, or forced formats per step such as "0=dense,2=sparse" (other steps stay auto)."""
    dense_min_share: float = 0.9
    """auto stores a step dense only when at least this share of its [rows, V] table is valid."""
    dense_max_bytes: int = 268435456
    """...and when its dense table takes at most this many bytes."""
    device: str = "cpu"
    """cpu, or cuda:N to stream the finished tables to that GPU while building."""
    model_version: str = ""
    """Free text recorded in the manifest (e.g. the model checkpoint tag)."""
    keep: int = 0
    """After publishing, keep only the newest N versions (0: keep all)."""
    promote: bool = True
    """Point LATEST at the new version when publishing (False: publish it unpromoted; `zerogr promote`)."""
    kernel_archs: tuple[str, ...] = ("sm_80", "sm_90")
    """CUDA archs whose cubins (plus PTX) the bundle ships when nvcc is found (empty: ship no kernels)."""
    engine: str = "local"
    """local (this process), or ray: a partitioned build on a Ray cluster (the same bundle, byte for byte)."""
    ray_address: str = ""
    """engine = ray: the cluster (host:port of its head, ray://host:port, or auto); empty starts a Ray
    instance on this machine for the build."""
    partitions: int = 0
    """engine = ray: partitions of the catalog, each built by one task (0: one per CPU of the cluster)."""

    def manifest_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the settings (tuples as lists), recorded in the bundle manifest."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


def _coerce(key: str, value: Any, default: Any, where: str) -> Any:
    """Check a value against its default's type; lists become tuples. Raises InputError naming the key."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif key == "codebook_sizes" and value == INFER_CODEBOOK_SIZES:
        ok = True
    elif isinstance(default, tuple):
        item_type = int if key == "codebook_sizes" else str
        if isinstance(value, str) and key == "sid_columns":
            value = parse_name_list(value)
        if isinstance(value, str) and key == "kernel_archs":
            value = [v.strip() for v in value.split(",") if v.strip()]
        ok = isinstance(value, list | tuple) and all(
            isinstance(v, item_type) and not isinstance(v, bool) for v in value
        )
        value = tuple(value) if ok else value
    else:  # pragma: no cover - every field has one of the types above
        ok = True
    if not ok:
        raise InputError(
            f"{where}: {key} = {value!r} has the wrong type (expected {_type_name(default, key)})"
        )
    return value


def _type_name(default: Any, key: str) -> str:
    if isinstance(default, tuple):
        return (
            f'a list of integers or "{INFER_CODEBOOK_SIZES}"'
            if key == "codebook_sizes"
            else "a list of strings"
        )
    return type(default).__name__


def _check_values(s: BuildSettings, where: str) -> None:
    if not s.out:
        raise InputError(f"{where}: out must not be empty")
    if s.workers < 0:
        raise InputError(f"{where}: workers must be >= 0 (0 = all cores), got {s.workers}")
    if s.keep < 0:
        raise InputError(f"{where}: keep must be >= 0 (0 = keep all versions), got {s.keep}")
    if not 0.0 <= s.dense_min_share <= 1.0:
        raise InputError(f"{where}: dense_min_share must be in 0..1, got {s.dense_min_share}")
    if s.dense_max_bytes < 0:
        raise InputError(f"{where}: dense_max_bytes must be >= 0, got {s.dense_max_bytes}")
    if isinstance(s.codebook_sizes, tuple) and any(v < 1 for v in s.codebook_sizes):
        raise InputError(f"{where}: codebook sizes must be >= 1, got {list(s.codebook_sizes)}")
    parse_device(s.device, f"{where}: device")
    parse_kernel_archs(s.kernel_archs, f"{where}: kernel_archs")
    if s.engine not in ENGINES:
        raise InputError(f"{where}: engine must be one of {', '.join(ENGINES)}, got {s.engine!r}")
    if s.partitions < 0:
        raise InputError(
            f"{where}: partitions must be >= 0 (0 = one per CPU of the cluster), got {s.partitions}"
        )
    if s.sid_columns and len(set(s.sid_columns)) != len(s.sid_columns):
        raise InputError(f"{where}: sid_columns names a column twice: {list(s.sid_columns)}")


def read_config_table(config_file: str | Path, table: str) -> dict[str, Any]:
    """The `[table]` of a TOML config file ({} when absent). Raises InputError for a missing or invalid file
    and for unknown tables."""
    path = Path(config_file)
    data = read_small_toml(path, MAX_CONFIG_BYTES, "config file")
    for key, value in data.items():
        if not isinstance(value, dict):
            raise InputError(f"{path}: top-level key {key!r}; put settings under [build] (or [tune])")
        if key not in KNOWN_TABLES:
            raise InputError(f"{path}: unknown table [{key}] (known: {', '.join(sorted(KNOWN_TABLES))})")
    return dict(data.get(table, {}))


#: The settings that say how to read a catalog's columns (a bundle's manifest records them).
CATALOG_COLUMNS = ("sid_column", "sid_columns", "item_column")


def load_settings(
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    recorded: Mapping[str, Any] | None = None,
) -> BuildSettings:
    """Defaults, then the config file's [build] table, then `overrides` (None values are ignored, so CLI
    flags that were not given leave the file's value). Unknown keys and wrong types raise InputError.

    recorded: the settings a bundle was built with (its manifest's "settings"), a layer between the
    defaults and the config file for the catalog columns only: the SID layout (sid_column + sid_columns,
    taken together) when no other layer names either, and item_column when no other layer names it.
    """
    defaults = BuildSettings()
    known = {f.name: getattr(defaults, f.name) for f in fields(BuildSettings)}
    values, where = layered_values(
        "build", config_file, overrides, known, lambda key, value, at: _coerce(key, value, known[key], at)
    )
    if recorded:
        given = [key for key in CATALOG_COLUMNS if key in values]
        if "sid_column" in given or "sid_columns" in given:
            given += ["sid_column", "sid_columns"]  # one SID layout: never half from each layer
        for key in CATALOG_COLUMNS:
            if key not in given and key in recorded:
                values[key] = _coerce(key, recorded[key], known[key], "the bundle's recorded settings")
    settings = dataclasses.replace(defaults, **values)
    _check_values(settings, where)
    return settings


#: The orders a tune can measure: the Decoder's (runtime.decoder.ORDERS), and "auto" (the quality gate's).
TUNE_ORDERS = ("filter_first", "score_first", "unconstrained", "auto")


@dataclass(frozen=True)
class TuneSettings:
    """What `zerogr tune` measures. dtypes None: fp32 and bf16 on a GPU, fp32 on a CPU."""

    batch_sizes: tuple[int, ...] = (1, 8, 32, 128)
    beam_width: int = 16
    dtypes: tuple[str, ...] | None = None
    hidden_dim: int = 128
    weights: str | None = None
    warmup: int = 3
    iters: int = 10
    order: str = "filter_first"
    seed: int = 0


def load_tune_settings(
    config_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[TuneSettings, str | None]:
    """(TuneSettings, device or None): defaults, then the config file's [tune] table, then `overrides`
    (None values ignored, so CLI flags not given keep the file's value). Keys: the TuneSettings fields plus
    `device` ("" = not set: the command line must name it). Lists may be TOML arrays or "1,8,32" strings;
    an empty dtypes / weights means "not set". Unknown keys and bad values raise InputError."""
    defaults = TuneSettings()
    known = [*(f.name for f in fields(TuneSettings)), "device"]
    values, _ = layered_values("tune", config_file, overrides, known, _coerce_tune)
    device = values.pop("device", None) or None
    return dataclasses.replace(defaults, **values), device


def load_guard_thresholds(
    config_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> GuardThresholds:
    """The guards' thresholds (bundle.guards.GuardThresholds): defaults, then the config file's [guards]
    table, then `overrides`. Unknown keys, non-numbers and values out of range raise InputError."""
    from .bundle.guards import GuardThresholds

    known = [f.name for f in fields(GuardThresholds)]

    def coerce(key: str, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"{where}: {key} = {value!r} must be a number")
        return float(value)

    values, where = layered_values("guards", config_file, overrides, known, coerce)
    return GuardThresholds(**values).check(where)


@dataclass(frozen=True)
class FleetSettings:
    """The fleet's signed metadata, as push, rebuild --push, a remote promote and keys rotate sign it."""

    timestamp_expiry_days: float = 3.0
    """Days the signed timestamp stays valid: hosts refuse the fleet's metadata once it passes, so a
    build box that stopped signing (every rebuild renews it) or a store someone froze is noticed."""


def load_fleet_settings(config_file: str | Path | None = None) -> FleetSettings:
    """Defaults, then the config file's [fleet] table. Unknown keys and bad values raise InputError."""

    def coerce(key: str, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise InputError(f"{where}: {key} must be a number of days > 0, got {value!r}")
        return float(value)

    values, _ = layered_values("fleet", config_file, None, [f.name for f in fields(FleetSettings)], coerce)
    return dataclasses.replace(FleetSettings(), **values)


@dataclass(frozen=True)
class ConfigCheck:
    """What `check_config_file` found in a valid config file: the keys set in each table (tables absent
    from the file are left out) and notes on what the file leaves to the command line."""

    tables: Mapping[str, tuple[str, ...]]
    notes: tuple[str, ...] = ()


def check_config_file(config_file: str | Path) -> ConfigCheck:
    """Every table and key of a config file checked as the commands that read it check them ([build] as
    build and rebuild, [tune] as tune, [guards] as the guards, [fleet] as push), plus what those check only
    once they run: the [build] step_formats syntax, the [tune] device and order. InputError naming the
    file, the table and the first bad key; a file that passes can be given to any command's --config."""
    from .index import check_step_formats

    build = load_settings(config_file)
    try:
        check_step_formats(build.step_formats)
    except InputError as exc:
        raise InputError(f"{config_file} [build]: step_formats: {exc}") from None
    _, device = load_tune_settings(config_file)
    if device is not None:
        parse_device(device, f"{config_file} [tune]: device")
    load_guard_thresholds(config_file)
    load_fleet_settings(config_file)
    data = read_small_toml(Path(config_file), MAX_CONFIG_BYTES, "config file")
    tables = {name: tuple(table) for name, table in data.items()}
    notes = []
    if not build.codebook_sizes:
        notes.append(
            "[build] codebook_sizes is not set: build and rebuild then need --codebook-sizes "
            '(or codebook_sizes = "infer")'
        )
    return ConfigCheck(tables, tuple(notes))


def _coerce_tune(key: str, value: Any, where: str) -> Any:
    option = f"{where}: {key}"
    if key in ("batch_sizes", "dtypes"):
        text = ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)
        if key == "batch_sizes":
            return parse_positive_ints(text, option)
        return parse_dtypes(text) if text.strip() else None
    if key in ("weights", "device", "order"):
        if not isinstance(value, str):
            raise InputError(f"{option}: expected a string, got {value!r}")
        if key == "order" and value and value not in TUNE_ORDERS:
            raise InputError(f"{option}: expected one of {', '.join(TUNE_ORDERS)}, got {value!r}")
        return value or (None if key != "order" else TuneSettings().order)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{option}: expected an integer, got {value!r}")
    return value


def layered_values(
    section: str,
    config_file: str | Path | None,
    overrides: Mapping[str, Any] | None,
    known: Collection[str],
    coerce: Callable[[str, Any, str], Any],
) -> tuple[dict[str, Any], str]:
    """The settings given for one [section]: the config file's table, then `overrides` on top (None values
    ignored, so CLI flags that were not given leave the file's value), each checked by coerce(key, value,
    where). Returns (values, where they came from). Unknown keys raise InputError naming the layer."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if config_file is not None:
        layers.append((f"{config_file} [{section}]", read_config_table(config_file, section)))
    if overrides:
        layers.append(("command line", {k: v for k, v in overrides.items() if v is not None}))
    values: dict[str, Any] = {}
    for where, layer in layers:
        for key, value in layer.items():
            if key not in known:
                raise InputError(f"{where}: unknown setting {key!r} (known: {', '.join(known)})")
            values[key] = coerce(key, value, where)
    return values, " + ".join(where for where, _ in layers) or "settings"


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """ "2048,2048,2048" -> (2048, 2048, 2048). Raises InputError naming the option for anything but
    comma-separated ASCII decimal integers (an empty list or item, "1_0", "²" included)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(_INT_RE.fullmatch(p) for p in parts):
        raise InputError(f"{option}: expected comma-separated integers, got {text[:200]!r}")
    return tuple(int(p) for p in parts)


def parse_name_list(text: str) -> tuple[str, ...]:
    """ "c0, c1,c2" -> ("c0", "c1", "c2")."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def parse_positive_ints(text: str, option: str) -> tuple[int, ...]:
    """'1,8,32' -> (1, 8, 32): one value or more, each >= 1; InputError naming the option otherwise."""
    values = parse_int_list(text, option)
    if not values or any(v < 1 for v in values):
        raise InputError(f"{option}: expected positive integers, got {text!r}")
    return values


def parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    """'fp32,bf16' -> ("fp32", "bf16") (None stays None); InputError for anything but fp32, fp16, bf16."""
    if text is None:
        return None
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in DTYPE_NAMES]
    if not names or bad:
        raise InputError(f"--dtypes: expected a list of {', '.join(DTYPE_NAMES)}, got {text!r}")
    return names
