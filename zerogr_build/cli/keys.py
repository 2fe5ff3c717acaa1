"""`zerogr keys new`: the Ed25519 key pair that signs the versions a build box pushes, and `zerogr keys
rotate`: a fleet's signed metadata moved to new keys (docs/fleet.md, "Signed versions"). The logic is the
library's (fleet/keys.py, fleet/rotate.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..fleet.keys import new_key
from ._errors import cli_errors
from ._options import FleetConfigOpt, JsonOpt, RootOutOpt, timestamp_expiry_s

keys_app = typer.Typer(
    name="keys",
    help="Signing keys for pushed versions: the build box signs with the private key, every serving host "
    "trusts the public one (zerogr push --signing-key, zerogr pull --trusted-keys); rotate moves a fleet "
    "to new keys.",
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


@keys_app.command("rotate")
def rotate(
    remote: Annotated[
        str, typer.Argument(help="The remote OUT: s3://bucket/prefix", metavar="S3_URL", show_default=False)
    ],
    signing_key: Annotated[
        list[Path],
        typer.Option(
            "--signing-key",
            help="The fleet's current private key (repeat it when its root needs several).",
            metavar="KEY",
            show_default=False,
        ),
    ],
    new_key: Annotated[
        list[Path],
        typer.Option(
            "--new-key",
            help="A new private key (zerogr keys new); repeat it for several. Every one signs the new root.",
            metavar="KEY",
            show_default=False,
        ),
    ],
    threshold: Annotated[
        int, typer.Option("--threshold", help="How many of the new keys must sign a later root.")
    ] = 1,
    root_out: RootOutOpt = None,
    config: FleetConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Move a fleet's signed metadata to new keys: a new root metadata version names the new keys for
    every role (the root role needs --threshold of them), signed by the current keys and the new ones;
    the rest of the metadata is signed again. --root-out FILE writes that new root: hand it to every host
    (pull --trusted-root FILE). Hosts that remember the fleet (OUT/.tuf/) follow the rotation on their
    next pull. From then on a push, rollback or rotation signed with a retired key is exit 2, and
    metadata signed by a retired key alone is exit 4 on every host that followed the rotation, was given
    the new root, or no longer lists the retired key in its trusted-keys file. A host that starts without
    memory and still trusts a retired key, with no --trusted-root, can be served a fleet that someone
    holding that key re-signed: replace the retired key's line with the new key's .pub on every host, and
    give hosts the new root. Sign with the new key from now on (push --signing-key, rebuild
    --push-signing-key). Exit 2 for keys the fleet's root does not name, 3 when the store failed, 4 when
    its metadata does not verify."""
    from ..base.printable import safe_text
    from ..fleet.metadata import iso
    from ..fleet.roots import write_root_file
    from ..fleet.rotate import rotate_keys

    with cli_errors():
        done = rotate_keys(
            remote, signing_key, new_key, threshold=threshold, timestamp_expiry_s=timestamp_expiry_s(config)
        )
        if root_out is not None:
            write_root_file(root_out, done.root)
        if json_out:
            info = {k: v for k, v in done.__dict__.items() if k != "root"}
            sys.stdout.write(json.dumps(info | {"root_out": str(root_out) if root_out else None}) + "\n")
            return
        retired = f"; retired {', '.join(done.retired)}" if done.retired else ""
        hand = (
            f"; hand {safe_text(root_out)} to every host (pull --trusted-root) and replace the retired key "
            "in their trusted-keys files"
            if root_out is not None
            else "; replace the retired key in the hosts' trusted-keys files"
        )
        sys.stdout.write(
            f"{done.url}/tuf/{done.root_version}.root.json: the fleet's keys are {', '.join(done.keys)} "
            f"(root threshold {done.threshold}){retired}; its metadata expires {iso(done.expires)}. Hosts "
            f"with memory follow on their next pull{hand}; sign with the new key from now on\n"
        )
