"""`zerogr config`: the packaged default config, every [build], [tune], [guards] and [fleet] key with its
default."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..base.errors import InputError
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
) -> None:
    """Print the default config file that every --config FILE overrides (keys not in FILE keep these
    values; command-line flags override both)."""
    with cli_errors():
        if not show_defaults:
            raise InputError("nothing to do: pass --show-defaults to print the default config")
        from ..config import default_config_text

        sys.stdout.write(default_config_text())
