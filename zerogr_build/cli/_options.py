"""Options shared by several commands, as `Annotated` aliases (huggingface_hub's `_cli_utils` style), and
the helpers that turn them into settings."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from ..base.errors import InputError
from ..config import load_settings, parse_name_list

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML file with a [build] table (zerogr config --show-defaults prints one).",
        show_default=False,
    ),
]
FleetConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML file with a [fleet] table: timestamp_expiry_days, how long the fleet's signed timestamp "
        "stays valid (zerogr config --show-defaults prints one).",
        show_default=False,
    ),
]
PromoteConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML file: its [guards] table for --guards on a local version, its [fleet] table "
        "(timestamp_expiry_days) for a signed remote one (zerogr config --show-defaults prints both).",
        show_default=False,
    ),
]
BundleArg = Annotated[
    str | None,
    typer.Argument(
        help="A version dir, or an OUT dir (its LATEST is read). Default: the configured OUT (bundles).",
        metavar="BUNDLE",
        show_default=False,
    ),
]

# The catalog columns: `build` reads the catalog with them, `verify --catalog` reads its catalog the same way.
SidColumnOpt = Annotated[
    str | None, typer.Option("--sid-column", help="List column holding each SID [config: sid]")
]
SidColumnsOpt = Annotated[
    str | None,
    typer.Option(
        "--sid-columns", help="SID tokens as separate integer columns, e.g. c0,c1,c2", show_default=False
    ),
]
AcceptChangeOpt = Annotated[
    str | None,
    typer.Option(
        "--accept-change",
        help="Let fired guards through for an intended change (a new catalog scope, a model with other "
        "SIDs); REASON is recorded in the manifest (accept_change) and the metrics.",
        metavar="REASON",
        show_default=False,
    ),
]
AvailableOpt = Annotated[
    str | None,
    typer.Option(
        "--available",
        help="Parquet availability mask: item ids (first column) and an optional boolean column "
        "(docs/constraints.md). Not part of the bundle.",
        show_default=False,
    ),
]
ItemColumnOpt = Annotated[
    str | None, typer.Option("--item-column", help="Item id column, integer or string [config: item_id]")
]


def with_help(alias: Any, help: str) -> Any:
    """The same option (flags, type, defaults) with another help text, for a command that words it for its
    own use (e.g. `verify` says which catalog the column belongs to)."""
    base, option = get_args(alias)
    reworded = copy.copy(option)
    reworded.help = help
    return Annotated[base, reworded]


def catalog_column_overrides(
    sid_column: str | None, sid_columns: str | None, item_column: str | None
) -> dict[str, Any]:
    """Settings overrides of the catalog column options shared by `build` and `verify --catalog`."""
    if sid_column is not None and sid_columns is not None:
        raise InputError("--sid-column and --sid-columns are mutually exclusive")
    overrides: dict[str, Any] = {"sid_column": sid_column, "item_column": item_column}
    if sid_columns is not None:
        overrides["sid_columns"] = parse_name_list(sid_columns)
    elif sid_column is not None:
        overrides["sid_columns"] = ()  # --sid-column on the command line beats sid_columns in a config
    return overrides


def bundle_path(bundle: str | None, config: Path | None) -> str:
    """BUNDLE as given, else the OUT dir of the config (or of the defaults)."""
    if bundle is not None:
        return bundle
    return load_settings(config).out


MetricsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--metrics-file",
        help="Write Prometheus text-format metrics here when the command ends (node_exporter textfile "
        "collector; written atomically, on failure too): last success, exit status, durations, bundle facts.",
        show_default=False,
    ),
]
TrustedKeysOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--trusted-keys",
        help="A file of the public keys (ssh-ed25519 lines, from zerogr keys new) whose signatures this host "
        "accepts; repeat it, or list several keys in the file, while keys rotate. A version not signed by "
        "one of them is refused (exit 4).",
        show_default=False,
    ),
]
TrustedRootOpt = Annotated[
    Path | None,
    typer.Option(
        "--trusted-root",
        help="The fleet's current root metadata file (N.root.json, written by zerogr keys rotate --root-out "
        "or push --root-out): this host never starts from an older root, and refuses a store whose roots "
        "stop short of it (exit 4). Give it to hosts that start without memory (new, re-imaged, a pod); "
        "with --trusted-keys too, that root must be signed by those keys. Alone, its keys are trusted.",
        show_default=False,
    ),
]
RootOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--root-out",
        help="Write the fleet's current root metadata to this file once signed: hand it to every host "
        "(zerogr pull --trusted-root FILE), so a host without memory never starts from a retired key.",
        show_default=False,
    ),
]
AllowUnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned",
        help="An unsigned fleet: read remote versions without checking a signature (whoever can write the "
        "store then decides what this host installs). A remote OUT needs this or --trusted-keys.",
    ),
]
SigningKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--signing-key",
        help="Sign the pushed version with this Ed25519 private key (zerogr keys new; mode 0600). Hosts "
        "with --trusted-keys install only signed versions.",
        show_default=False,
    ),
]


def timestamp_expiry_s(config: Path | None) -> float:
    """Seconds the fleet's signed timestamp stays valid: [fleet] timestamp_expiry_days of `config`."""
    from ..config import load_fleet_settings

    return load_fleet_settings(config).timestamp_expiry_days * 86400.0
