"""`zerogr push` (a local version to a remote OUT), `zerogr pull` (the remote LATEST into a local OUT) and
`zerogr status` (the versions of a local or remote OUT): the path from the build box to the serving fleet.

Exit codes of push and pull, for a scheduler (also in their --help and docs/fleet.md):
    0  done, or nothing to do (the version was there already)
    2  bad usage or configuration (arguments, no credentials, access denied, no such bucket, an OUT that
       is not a mirror of the remote): fix it, do not retry
    3  the store could not be reached or failed, or the local disk is too small: retry later
    4  refused: the version is incomplete, corrupt or hostile, or the fleet's signed metadata is expired,
       replayed or not signed by its keys (pull); the local version fails verification (push); nothing
       was installed or published
    5  pull only: nothing published yet (no remote LATEST) or no such --version
    1  anything else
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..base.errors import InputError
from ..base.printable import safe_text
from ..bundle.format import parse_version_dir
from ..fleet.metadata import ExpiredFleetMetadata
from ..fleet.pull import pull_version
from ..fleet.push import push_version
from ..fleet.remote import RemoteOut, is_remote
from ..fleet.roots import write_root_file
from ..fleet.signing import host_trust
from ..fleet.status import out_status
from ._errors import cli_errors, warnings_on_stderr
from ._live_metrics import live_facts
from ._metrics import JobMetrics, job_metrics
from ._options import (
    AllowUnsignedOpt,
    ConfigOpt,
    FleetConfigOpt,
    JsonOpt,
    MetricsFileOpt,
    RootOutOpt,
    SigningKeyOpt,
    TrustedKeysOpt,
    TrustedRootOpt,
    bundle_path,
    timestamp_expiry_s,
)
from ._progress import progress_for
from ._render import human_bytes, status_table, stdout_console

EXIT_CODES = (
    "Exit codes: 0 done, or nothing to do; 2 bad usage or configuration (arguments, credentials, access, "
    "bucket): fix, do not retry; 3 the store could not be reached or failed, or the local disk is too "
    "small: retry later; 4 refused: {refused}; nothing was changed; {five}1 anything else."
)
KeepOpt = Annotated[
    int | None,
    typer.Option(
        "--keep",
        help="Then keep only the newest N versions (never the one LATEST names).",
        show_default=False,
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the version path/URL.")]
PushAllowUnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned",
        help="Without --signing-key, move the remote LATEST to the unsigned version even when it names a "
        "signed one (hosts with --trusted-keys then refuse it and keep serving what they have).",
    ),
]


def push(
    version_dir: Annotated[
        str,
        typer.Argument(
            help="A local version dir, or an OUT dir (the version its LATEST names).",
            metavar="VERSION_DIR",
            show_default=False,
        ),
    ],
    dest: Annotated[
        str, typer.Argument(help="The remote OUT: s3://bucket/prefix", metavar="S3_URL", show_default=False)
    ],
    promote: Annotated[
        bool,
        typer.Option(
            "--promote/--no-promote",
            help="Move the remote LATEST to the pushed version (never to an older one than it names).",
        ),
    ] = True,
    keep: KeepOpt = None,
    signing_key: SigningKeyOpt = None,
    allow_unsigned: PushAllowUnsignedOpt = False,
    root_out: RootOutOpt = None,
    config: FleetConfigOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Publish a verified local version to a remote OUT with the same layout (prefix/vNNNNNN/, prefix/LATEST).

    The version is verified (every sha256 and invariant) first. It keeps its number: remote vN for local
    vN, claimed with a create-only write (exit 2 when the fleet holds another version under it, or a
    higher one to promote over). Every file is uploaded and read back (size and sha256), the manifest
    last. With --signing-key the fleet's signed metadata (tuf/) then lists it and, unless --no-promote,
    names it as LATEST, and its timestamp is renewed ([fleet] timestamp_expiry_days of --config);
    --root-out FILE then writes the fleet's current root metadata, for the hosts' --trusted-root. Pushing
    a version pushed before uploads nothing. Without --signing-key the version is unsigned (one warning):
    hosts with --trusted-keys follow only the signed metadata, so on a signed fleet the plain LATEST is
    not moved (exit 2, before anything is uploaded) unless --allow-unsigned. Credentials: the standard
    AWS_* environment (AWS_ENDPOINT_URL for an S3-compatible server); needs zerogr[s3].
    """
    with job_metrics("push", metrics_file) as metrics, cli_errors(), warnings_on_stderr():
        timings: dict[str, float] = {}
        if root_out is not None and signing_key is None:
            raise InputError("--root-out needs --signing-key: only a signed fleet has root metadata")
        try:
            with progress_for(quiet or json_out) as progress:
                result = push_version(
                    version_dir, dest, promote=promote, keep=keep, signing_key=signing_key,
                    allow_unsigned=allow_unsigned, timestamp_expiry_s=timestamp_expiry_s(config),
                    progress=progress, timings=timings,
                )  # fmt: skip
        finally:
            metrics.add_stages(timings)
        metrics.bundle_from_manifest(result.manifest, result.local_version)
        metrics.bundle(remote_version=result.version)
        metrics.fleet(expires=result.expires, latest=result.fleet_latest)
        url = f"{result.url}/v{result.version:06d}"
        if root_out is not None and result.root is not None:
            write_root_file(root_out, result.root)
            sys.stderr.write(
                f"{safe_text(root_out)}: the fleet's root metadata, version {result.root.signed.version}: "
                "hand it to every host (zerogr pull --trusted-root)\n"
            )
        if result.signed_by is None:
            sys.stderr.write(
                f"warning: {url}: pushed without --signing-key; hosts with --trusted-keys refuse unsigned "
                "versions\n"
            )
        if json_out:
            sys.stdout.write(json.dumps(result.as_dict(), default=str) + "\n")
            return
        if quiet:
            sys.stdout.write(url + "\n")
            return
        what = "uploaded" if result.uploaded else "already there (pushed before), nothing uploaded"
        lines = [f"{url}: {what}; {result.files} files, {human_bytes(result.bytes)}"]
        if result.promoted:
            lines.append(f"LATEST -> v{result.version:06d}")
        elif promote:
            lines.append(f"LATEST left at {safe_text(result.latest)} (newer than v{result.version:06d})")
        if result.pruned:
            lines.append(f"pruned {', '.join(result.pruned)}")
        sys.stdout.write("\n".join(lines) + "\n")


push.__doc__ = (
    inspect.cleandoc(push.__doc__ or "")
    + "\n\n"
    + EXIT_CODES.format(refused="the local version fails verification", five="")
)


def pull(
    source: Annotated[
        str, typer.Argument(help="The remote OUT: s3://bucket/prefix", metavar="S3_URL", show_default=False)
    ],
    out: Annotated[
        str,
        typer.Argument(
            help="The local OUT dir to install into (only pull should write it).",
            metavar="OUT",
            show_default=False,
        ),
    ],
    version: Annotated[
        int | None,
        typer.Option("--version", help="Pull this version instead of the one remote LATEST names."),
    ] = None,
    keep: KeepOpt = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Also check every invariant (as `zerogr verify`) before installing; memory then grows "
            "with the bundle. Without it: sizes, sha256s and array headers.",
        ),
    ] = False,
    follow_remote: Annotated[
        bool,
        typer.Option(
            "--follow-remote",
            help="Point OUT/LATEST at the remote version even when it was promoted here (a local rollback "
            "with zerogr promote); later pulls then follow the remote again.",
        ),
    ] = False,
    trusted_keys: TrustedKeysOpt = None,
    trusted_root: TrustedRootOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Install the version the remote LATEST names (or --version N) into OUT and point OUT/LATEST at it.

    For a cron job on every serving host. With --trusted-keys, the fleet's signed metadata is checked
    first (python-tuf: the keys anchor its root; expired, replayed or mixed metadata, a version not signed
    or changed after signing: refused, exit 4, naming the file or the expiry); the version its LATEST
    names is pulled. The host remembers what it trusted in OUT/.tuf/; one without that memory starts from
    --trusted-root (the fleet's current root, handed to it) or else from the newest root its keys sign,
    and refuses a store whose chain of roots is broken or stops short of the root it was given. A host
    that trusts no key must say --allow-unsigned. Each file streams to a temp dir under OUT, its size and
    sha256 checked as it arrives (memory does not grow with the bundle); the version appears by one
    rename under OUT's lock, as a local publish. Already there: nothing is
    downloaded (exit 0). A truncated, corrupt, incomplete or hostile remote version is refused with one
    line naming the object, and OUT stays as it was. A LATEST promoted here away from the version pull
    last installed (a rollback of this host) is held: pull downloads nothing, leaves it and says so in one
    line on stderr (exit 0, metric zerogr_pull_held 1) until --follow-remote. Credentials: the standard
    AWS_* environment; needs zerogr[s3].
    """
    with job_metrics("pull", metrics_file) as metrics, cli_errors(), warnings_on_stderr():
        timings: dict[str, float] = {}
        try:
            with progress_for(quiet or json_out) as progress:
                url = RemoteOut.parse(source).url  # a URL that breaks the rules is refused first, redacted
                trust = host_trust(
                    trusted_keys, allow_unsigned, required=True, what=url, trusted_root=trusted_root
                )
                result = pull_version(
                    source, out, version=version, keep=keep, verify=verify, follow_remote=follow_remote,
                    trust=trust, progress=progress, timings=timings,
                )  # fmt: skip
        except BaseException as exc:
            if isinstance(exc, ExpiredFleetMetadata):  # the alert on the expiry fires from this gauge
                metrics.fleet(expires=exc.expires)
            metrics.bundle(**live_facts(Path(out)))  # what this host still serves
            raise
        finally:
            metrics.add_stages(timings)
        metrics.fleet(expires=result.expires, latest=result.fleet_latest)
        held_doc = "1 when OUT/LATEST was promoted here and pull left it there (a local rollback)."
        metrics.job_value("held", held_doc, result.held is not None)
        info = result.as_dict()
        if result.held is not None:
            metrics.bundle(version=parse_version_dir(result.held))
            sys.stderr.write(
                f"note: {safe_text(out)}/LATEST stays at {safe_text(result.held)}, promoted here away from "
                f"the version pull installed; remote v{result.version:06d} not pulled "
                "(zerogr pull --follow-remote to follow the remote again)\n"
            )
            if json_out:
                sys.stdout.write(json.dumps(info, default=str) + "\n")
            elif quiet:
                sys.stdout.write(f"{Path(out) / result.held}\n")
            return
        metrics.bundle_from_manifest(result.manifest, result.version)
        if json_out:
            sys.stdout.write(json.dumps(info, default=str) + "\n")
            return
        if quiet:
            sys.stdout.write(info["path"] + "\n")
            return
        if result.installed:
            size = human_bytes(result.bytes)
            line = f"{info['path']}: installed from {result.url}; {result.files} files, {size}"
        else:
            line = f"{info['path']}: already there, nothing downloaded"
        lines = [line]
        if result.latest_moved:
            lines.append(f"LATEST -> v{result.version:06d}")
        if result.pruned:
            lines.append(f"pruned {', '.join(result.pruned)}")
        sys.stdout.write("\n".join(lines) + "\n")


pull.__doc__ = (
    inspect.cleandoc(pull.__doc__ or "")
    + "\n\n"
    + EXIT_CODES.format(
        refused="the remote version is incomplete, corrupt or hostile",
        five="5 nothing published yet (no remote LATEST) or no such --version; ",
    )
)


def status(
    target: Annotated[
        str | None,
        typer.Argument(
            help="A local OUT dir or a remote s3://bucket/prefix. Default: the configured OUT (bundles).",
            metavar="OUT",
            show_default=False,
        ),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify", help="Remote: also stream every object and check its sha256 (reads the whole OUT)."
        ),
    ] = False,
    trusted_keys: TrustedKeysOpt = None,
    trusted_root: TrustedRootOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """List the versions of an OUT: which one LATEST names, each one's age, size, model tag, plans and
    kernels, the quality gate's recorded decision per model tag, and whether it passes its check.

    Local versions are verified completely (every sha256 and invariant, as `zerogr verify`). Remote ones
    get a cheap check: a valid manifest and every listed object present with its exact size; --verify also
    downloads and hashes every object. With --trusted-keys a remote OUT's signed metadata is checked as a
    host checks it (LATEST is the version it names; when it expires is shown, and written to
    --metrics-file), and every version must be signed; a local version's proof is checked against the
    metadata its pull kept (a remote OUT needs --trusted-keys or --allow-unsigned). Exit codes: 0 LATEST
    names a version that passes and no complete version fails; 4 otherwise (a failing version, no usable
    LATEST, expired or unsigned metadata); 2 bad usage or configuration; 3 the store could not be
    reached; 1 anything else.
    """
    with job_metrics("status", metrics_file) as metrics, cli_errors():
        where = target if target is not None else bundle_path(None, config)
        remote = is_remote(where)
        what = RemoteOut.parse(where).url if remote else where  # a bad URL is refused first, redacted
        trust = host_trust(
            trusted_keys, allow_unsigned, required=remote, what=what, trusted_root=trusted_root
        )
        try:
            report = out_status(where, verify=verify, trust=trust)
        except ExpiredFleetMetadata as exc:
            metrics.fleet(expires=exc.expires)
            raise
        fleet = report.get("fleet") or {}
        latest = parse_version_dir(report["latest"]) if isinstance(report["latest"], str) else None
        metrics.fleet(expires=fleet.get("expires"), latest=latest if fleet else None)
        if json_out:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
        else:
            stdout_console().print(status_table(report))
        if not report["ok"]:
            raise typer.Exit(4)


def promote_remote(
    url: str,
    metrics: JobMetrics,
    trusted_keys: list[Path] | None,
    allow_unsigned: bool,
    signing_key: Path | None,
    config: Path | None,
) -> None:
    """`zerogr promote s3://bucket/prefix/vNNNNNN`: move the remote LATEST to that complete version, backwards
    included (a fleet rollback): with --signing-key, new signed metadata naming it (a signed fleet; it
    must have been pushed signed), else by compare-and-swap on an unsigned fleet (--allow-unsigned); one
    line on stdout naming both versions, and the previous version in the metrics
    (zerogr_promote_previous_version; 0: there was no LATEST)."""
    from ..fleet.remote import parse_version_url
    from ..fleet.rollback import move_remote_latest

    remote, _ = parse_version_url(url)  # a URL that breaks the rules is refused first, redacted
    trust = None
    if signing_key is None:
        trust = host_trust(trusted_keys, allow_unsigned, required=True, what=remote.url)
    elif allow_unsigned:
        raise InputError("--signing-key and --allow-unsigned contradict each other; give one")
    with metrics.stage("promote"):
        move = move_remote_latest(
            url, trust=trust, signing_key=signing_key, timestamp_expiry_s=timestamp_expiry_s(config)
        )
    metrics.bundle_from_manifest(move.manifest, move.version)
    metrics.fleet(expires=move.expires, latest=move.version if move.signed_by else None)
    previous = parse_version_dir(move.previous) if move.previous else None
    metrics.job_value("previous_version", "The version remote LATEST named before this run.", previous or 0)
    target = f"v{move.version:06d}"
    if not move.moved:
        sys.stdout.write(f"{move.url}/LATEST -> {target} (already)\n")
        return
    direction = " (backwards: a rollback)" if previous is not None and previous > move.version else ""
    signed = f", signed by {move.signed_by}" if move.signed_by else ""
    sys.stdout.write(
        f"{move.url}/LATEST: {safe_text(move.previous or '(none)')} -> {target}{direction}{signed}\n"
    )
