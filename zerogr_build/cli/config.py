"""`zerogr config`: the packaged default config (every [build], [tune], [guards] and [fleet] key with its
default), and the check of a config file before a scheduler runs with it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..base.errors import InputError
from ..base.printable import printable
from ._errors import cli_errors


def config(
    show_defaults: Annotated[
        bool,
        typer.Option(
            "--show-defaults",
            help="Print the default config (TOML, every key commented) to stdout: "
            "zerogr config --show-defaults > zerogr.toml, edit, then --config zerogr.toml.",
        ),
    ] = False,
    check: Annotated[
        Path | None,
        typer.Option(
            "--check",
            metavar="FILE",
            help="Check a config file as the commands that read it would: every table and key known, every "
            "value of the right type and range. Exit 0 and one line per table on stdout, or exit 2 and one "
            "line naming the file, the table and the bad key.",
        ),
    ] = None,
) -> None:
    """Print the default config file that every --config FILE overrides (keys not in FILE keep these
    values; command-line flags override both), or check a config file (--check FILE) before a cron job or
    a systemd unit runs with it."""
    with cli_errors():
        if show_defaults == (check is not None):
            raise InputError("pass one of --show-defaults (print the default config) or --check FILE")
        if show_defaults:
            from ..config import default_config_text

            sys.stdout.write(default_config_text())
            return
        from ..config import check_config_file

        found = check_config_file(check)
        for table, keys in found.tables.items():
            sys.stdout.write(f"{printable(str(check))} [{table}]: ok ({', '.join(keys) or 'no keys'})\n")
        if not found.tables:
            sys.stdout.write(f"{printable(str(check))}: ok (empty: every key keeps its default)\n")
        for note in found.notes:
            sys.stderr.write(f"zerogr config: note: {note}\n")
