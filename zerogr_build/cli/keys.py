"""`zerogr keys new`: the Ed25519 key pair that signs the versions a build box pushes (docs/fleet.md,
"Signed versions"). The logic is the library's (fleet/keys.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..fleet.keys import new_key
from ._errors import cli_errors
from ._options import JsonOpt

keys_app = typer.Typer(
    name="keys",
    help="Signing keys for pushed versions: the build box signs with the private key, every serving host "
    "trusts the public one (zerogr push --signing-key, zerogr pull --trusted-keys).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@keys_app.command("new")
def new(
    key_file: Annotated[
        Path,
        typer.Argument(
            help="Where to write the private key (mode 0600); the public key goes to KEY_FILE.pub.",
            metavar="KEY_FILE",
            show_default=False,
        ),
    ],
    comment: Annotated[
        str | None,
        typer.Option(
            "--comment",
            help="Text after the public key on its line (default: zerogr and the key id).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Generate an Ed25519 key pair for signing versions: KEY_FILE (the private key, PEM, mode 0600: keep
    it on the build box only, for zerogr push --signing-key) and KEY_FILE.pub (one ssh-ed25519 line: copy
    it to every serving host's --trusted-keys file). Neither file is ever overwritten: an existing one is
    exit 2. Prints the public key line and the key id (SHA256:..., as ssh-keygen -l shows it). Needs
    zerogr[s3] (the cryptography package)."""
    with cli_errors():
        made = new_key(key_file, comment=comment)
        if json_out:
            sys.stdout.write(json.dumps(made.__dict__) + "\n")
            return
        sys.stdout.write(
            f"{made.public_line}\n"
            f"key id {made.key_id}: private key {made.private_path} (mode 0600, build box only), "
            f"public key {made.public_path} (for every host's --trusted-keys)\n"
        )
