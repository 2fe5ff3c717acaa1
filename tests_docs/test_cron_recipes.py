"""Every crontab line of the docs (```text title="crontab"``` blocks of README.md and docs/*.md) is one line
cron accepts, and its command works under cron's environment.

- The syntax: each line is checked by the cron-syntax parser below (five time fields or an @keyword, an
  environment assignment, a comment); where `crontab` is installed and ZEROGR_TEST_CRONTAB_USER names a
  throwaway user (.ci/run creates one), each block is also installed with `crontab -u USER` and removed.
- The command: run with /bin/sh under `env -i PATH=/usr/bin:/bin HOME=...`, as cron runs it, with the
  documented paths mapped to temp paths (the venv's zerogr to this test run's, `--gpu 0` to the CPU when
  there is no GPU), against a local OUT, and for s3:// lines against the local S3 server (credentials and
  endpoint from ~/.aws of that HOME, as a cron user would keep them).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r'^```text title="crontab"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_NAMES = (
    {},
    {},
    {},
    {
        m: i + 1
        for i, m in enumerate(
            ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        )
    },
    {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
)
_KEYWORDS = ("@reboot", "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\s*=")
VENV_ZERGR = "/srv/zerogr/.venv/bin/zerogr"
MAKE_LOG_DIR = "mkdir -p /var/log/zerogr"


def crontab_blocks() -> list[tuple[str, str]]:
    """(where, text) of every crontab block of the docs."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in _BLOCK.finditer(text):
            found.append((f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
    return found


def _value(token: str, field: int) -> int:
    low, high = _FIELD_RANGES[field]
    value = _NAMES[field].get(token.lower()) if not token.isdigit() else int(token)
    if value is None or not low <= value <= high:
        raise ValueError(f"{token!r} is out of range {low}-{high}")
    return value


def check_field(text: str, field: int) -> None:
    """ValueError unless `text` is a valid cron time field: *, N, N-M, lists of them, each with /STEP."""
    for part in text.split(","):
        base, _, step = part.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            raise ValueError(f"bad step in {part!r}")
        if base == "*":
            continue
        first, dash, last = base.partition("-")
        if dash:
            if _value(first, field) > _value(last, field):
                raise ValueError(f"empty range {base!r}")
        elif step:
            raise ValueError(f"a step needs * or a range: {part!r}")
        else:
            _value(first, field)


def parse_crontab_line(line: str) -> str | None:
    """The command of one crontab line (None for a blank line, a comment or an environment setting);
    ValueError naming the problem otherwise."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#") or _ENV_LINE.match(stripped):
        return None
    if line.rstrip().endswith("\\"):
        raise ValueError("cron has no line continuations")
    if stripped.startswith("@"):
        keyword, _, command = stripped.partition(" ")
        if keyword not in _KEYWORDS:
            raise ValueError(f"unknown keyword {keyword}")
    else:
        fields = stripped.split(None, 5)
        if len(fields) < 6:
            raise ValueError("expected five time fields and a command")
        for i, text in enumerate(fields[:5]):
            check_field(text, i)
        command = fields[5]
    if "%" in command.replace("\\%", ""):
        raise ValueError("an unescaped % ends the command in cron")
    return command.strip()


def test_the_parser_refuses_what_crontab_refuses() -> None:
    assert parse_crontab_line("15 * * * * echo hi") == "echo hi"
    assert parse_crontab_line("*/5 1-3 * jan mon-fri echo") == "echo"
    assert parse_crontab_line("@hourly echo") == "echo"
    assert parse_crontab_line("# comment") is None and parse_crontab_line("MAILTO=ops") is None
    for bad in ("15 * * * echo", "61 * * * * echo", "15 * * * * zerogr rebuild \\", "* * * * * date +%s",
                "5-1 * * * * echo", "*/0 * * * * echo", "@often echo", "--out /srv * * * * x"):  # fmt: skip
        with pytest.raises(ValueError):
            parse_crontab_line(bad)


BLOCKS = crontab_blocks()


def test_the_docs_have_crontab_lines() -> None:
    places = {where.split(":")[0] for where, _ in BLOCKS}
    assert {"README.md", "docs/operations.md", "docs/fleet.md"} <= places


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_each_crontab_line_parses_and_installs(where: str, text: str, tmp_path: Path) -> None:
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            command = parse_crontab_line(line)
        except ValueError as exc:
            pytest.fail(f"{where}+{number}: {exc}: {line}")
        if command is not None:
            called = command.removeprefix(f"{MAKE_LOG_DIR} && ")
            assert called.split()[0] == VENV_ZERGR, f"{where}+{number}: call {VENV_ZERGR}"
            if ">>/var/log/zerogr/" in command:  # sh opens the log before zerogr runs: the dir must exist
                assert command.startswith(MAKE_LOG_DIR), f"{where}+{number}: start with {MAKE_LOG_DIR} &&"
            commands.append(command)
    assert commands, f"{where}: no crontab line"
    user = os.environ.get("ZEROGR_TEST_CRONTAB_USER")
    if user and shutil.which("crontab") and os.geteuid() == 0:
        tab = tmp_path / "crontab"
        tab.write_text(text)
        with _crontab_of(user):
            installed = subprocess.run(["crontab", "-u", user, str(tab)], capture_output=True, text=True)
            try:
                assert installed.returncode == 0, f"{where}: crontab refused it: {installed.stderr}"
                listed = subprocess.run(
                    ["crontab", "-u", user, "-l"], capture_output=True, text=True, check=True
                )
                assert all(c in listed.stdout for c in commands)
            finally:
                subprocess.run(["crontab", "-u", user, "-r"], capture_output=True)


@contextlib.contextmanager
def _crontab_of(user: str) -> Iterator[None]:
    """Hold the user's crontab for this test alone: the test workers install theirs for the same user, and
    one's install would replace another's before it is listed."""
    with open(Path(tempfile.gettempdir()) / f"zerogr-crontab-{user}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _local(command: str, root: Path, bucket: str | None) -> str:
    """The documented command with its paths mapped under `root` (and the bucket to `bucket`)."""
    zerogr = Path(sys.executable).parent / "zerogr"
    assert zerogr.is_file(), f"no zerogr console script next to {sys.executable}"
    mapping = {
        VENV_ZERGR: str(zerogr),
        "/data/exports/catalog/": f"{root / 'exports' / 'catalog'}/",
        "/data/model/TAG": str(root / "model" / "TAG"),
        "/srv/build/bundles": str(root / "build" / "bundles"),
        "/srv/bundles": str(root / "bundles"),
        "/srv/zerogr/keys/": f"{root / 'keys'}/",
        "/var/lib/node_exporter/textfile/": f"{root / 'textfile'}/",
        "/var/log/zerogr/": f"{root / 'log'}/",
        "/var/log/zerogr": str(root / "log"),
        "s3://bucket/": f"s3://{bucket}/",
    }
    for documented, local in mapping.items():
        command = command.replace(documented, local)
    if not _cuda():
        command = command.replace("--gpu 0", "--device cpu")
    mapped = command.replace(str(root), "ROOT").replace(str(zerogr), "ZEROGR")  # a venv may live in /tmp
    leftover = re.findall(r"(?<![\w.])/(?:srv|data|var|tmp|run|opt)/\S*", mapped)
    assert not leftover, f"unmapped paths {leftover} in {command}"
    return command


def _cron_home(root: Path, s3_server: str | None) -> Path:
    home = root / "home"
    (home / ".aws").mkdir(parents=True)
    if s3_server:
        (home / ".aws" / "credentials").write_text(
            "[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n"
        )
        (home / ".aws" / "config").write_text(f"[default]\nregion = us-east-1\nendpoint_url = {s3_server}\n")
    return home


def _fresh_bucket(name: str) -> None:
    import boto3

    bucket = boto3.resource("s3").Bucket(name)
    if bucket.creation_date is None:
        bucket.create()
    else:
        bucket.objects.all().delete()


def _run_as_cron(command: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}", "/bin/sh", "-c", command],
        capture_output=True, text=True, timeout=900, cwd=home,
    )  # fmt: skip


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_each_crontab_command_runs_under_cron_env(where: str, text: str, tmp_path: Path, request) -> None:
    from zerogr_build.synthetic import write_catalog

    commands = [c for c in map(parse_crontab_line, text.splitlines()) if c is not None]
    remote = any("s3://" in c for c in commands)
    s3_server = None
    if remote:
        request.getfixturevalue("s3_env")
        s3_server = request.getfixturevalue("s3_server")
        _fresh_bucket("bucket")
    home = _cron_home(tmp_path, s3_server)
    for sub in ("exports/catalog", "model", "textfile"):  # not log/: the line makes it
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    write_catalog(tmp_path / "exports" / "catalog" / "part-0.parquet", 3000, [2048, 2048, 2048], seed=1)
    (tmp_path / "model" / "TAG").write_text("ckpt-0007\n")
    if remote:  # the build box's signing key, and the hosts' copy of its public key
        from zerogr_build.fleet.keys import new_key

        (tmp_path / "keys").mkdir()
        made = new_key(tmp_path / "keys" / "build-box")
        shutil.copy(made.public_path, tmp_path / "keys" / "trusted.pub")
    for command in commands:  # in order: the build box's line before the serving host's pull
        local = _local(command, tmp_path, "bucket")
        done = _run_as_cron(local, home)
        logs = "".join(p.read_text() for p in sorted((tmp_path / "log").glob("*.log")))
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{local}\n{done.stderr}\n{logs}"
    for prom in (tmp_path / "textfile").glob("*.prom"):
        assert 'zerogr_job_exit_status{job="' in prom.read_text() and "} 0.0" in prom.read_text(), prom
    built = tmp_path / ("build/bundles" if remote else "bundles")
    assert (built / "LATEST").read_text() == "v000001\n"
    assert "ckpt-0007" in (built / "v000001" / "manifest.json").read_text()
    if remote:
        import boto3

        latest = boto3.client("s3").get_object(Bucket="bucket", Key="recs/bundles/LATEST")["Body"].read()
        assert latest == b"v000001\n"
        assert (tmp_path / "bundles" / "LATEST").read_text() == "v000001\n"  # the serving host pulled it


def test_each_gpu_crontab_line_of_the_operations_page_has_a_cpu_twin() -> None:
    """A CPU build box copies its line from the docs too: each `--gpu 0` line of docs/operations.md is there
    again with `--device cpu` (and nothing else changed)."""
    ops = [text for where, text in BLOCKS if where.startswith("docs/operations.md")]
    lines = [line for text in ops for line in text.splitlines()]
    gpu = [line for line in lines if " --gpu 0 " in line]
    assert gpu, "no GPU crontab line in docs/operations.md"
    for line in gpu:
        assert line.replace(" --gpu 0 ", " --device cpu ") in lines, f"no CPU twin of: {line}"
