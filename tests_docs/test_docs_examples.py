"""Every fenced ```bash and ```python block of README.md and docs/*.md runs, as written, on small inputs.

The convention (docs/development.md, "Tests"):
- the blocks of one document run in order in one fresh scratch dir, each in its own process: bash with
  `-e -o pipefail`, python with the scratch dir first on sys.path (as `python -c`). A later block may use
  the files an earlier one made, not its variables;
- the checkout's scripts/ is reachable from the scratch dir at the same relative path, and `zerogr` and
  `python` run this test run's interpreter (sys.executable, a venv's included: no symlinked interpreter,
  which would start the base install instead of the venv);
- a first line `# needs: X` marks a block: gpu (skipped without a CUDA device), s3 (runs with AWS_* pointing
  at the suite's moto S3 server, where a bucket `zerogr-demo` exists, emptied per document), slow (only
  with --run-slow), install (starts with `python -m pip install` of this checkout: the install command is
  checked and the rest runs), ci (the test command itself: .ci/run must run it verbatim), vllm (needs vLLM,
  which has its own venv: skipped here, run by tests_vllm/test_docs.py in that venv).
A document whose block fails fails here, naming the file, the line and the output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
RUN_LANGS = ("bash", "python")
NEEDS = ("gpu", "s3", "slow", "install", "ci", "vllm")
S3_BUCKET = "zerogr-demo"
BLOCK_TIMEOUT_S = 600
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
_NEEDS = re.compile(r"^#\s*needs:\s*(.+?)\s*$")
_INSTALL = re.compile(r'^python -m pip install torch==[\w.]+ -e (\.|"\.\[([\w,-]+)\]")$')


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, code, the line its fence opens on, and its `# needs:` marks."""

    doc: str
    line: int
    lang: str
    code: str
    needs: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def fenced_blocks(text: str, doc: str = "<text>") -> list[Block]:
    """Every top-level fenced block of a Markdown text (``` or ~~~ fences, closed by the same fence)."""
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        body: list[str] = []
        i += 1
        closing = re.compile(re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*")
        while i < len(lines) and not closing.fullmatch(lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{doc}:{start + 1}: fence {fence} is never closed")
        i += 1
        needs: tuple[str, ...] = ()
        if body and (mark := _NEEDS.match(body[0])):
            needs = tuple(n.strip() for n in mark.group(1).split(","))
        blocks.append(Block(doc, start + 1, lang, "\n".join(body) + "\n", needs))
    return blocks


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def runnable(path: Path) -> list[Block]:
    return [b for b in fenced_blocks(path.read_text(), str(path.relative_to(REPO))) if b.lang in RUN_LANGS]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available()


def _scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh working dir with scripts/ linked in, and the environment the blocks run with: `python` and
    `zerogr` first on PATH, both running sys.executable by its own path (so a venv's interpreter finds its
    pyvenv.cfg), then the interpreter's bin dir (the venv's pip, moto_server, ...)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "scripts").symlink_to(REPO / "scripts", target_is_directory=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, args in (("python", ""), ("zerogr", " -m zerogr_build.cli")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["HOME"] = env.get("HOME", str(tmp_path))
    env.pop("ZEROGR_DEBUG", None)
    return work, env


def _extras() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def install_rest(block: Block) -> str:
    """The commands of a `# needs: install` block after its install command (checked: pip installs this
    checkout, with extras pyproject.toml defines, chained with && to the rest)."""
    lines = [line for line in block.code.splitlines() if line.strip() and not line.startswith("#")]
    assert lines, f"{block.where}: an install block with no command"
    first, sep, rest = lines[0].partition(" && ")
    m = _INSTALL.match(first)
    assert m, f'{block.where}: expected `python -m pip install torch==X -e .` (or ".[extra]"), got {first!r}'
    unknown = set((m.group(2) or "").split(",")) - {""} - _extras()
    assert not unknown, f"{block.where}: extras {sorted(unknown)} are not in pyproject.toml"
    return "\n".join([rest, *lines[1:]]) if sep else "\n".join(lines[1:])


def _reset_bucket(request) -> dict[str, str]:
    """The moto server's AWS_* environment, with an empty bucket `zerogr-demo`."""
    import boto3

    env = request.getfixturevalue("s3_env")
    s3 = boto3.resource("s3")
    bucket = s3.Bucket(S3_BUCKET)
    if bucket.creation_date is None:
        s3.create_bucket(Bucket=S3_BUCKET)
    else:
        bucket.object_versions.delete()
        bucket.objects.all().delete()
    return env


def run_block(block: Block, work: Path, env: dict[str, str], scripts: Path, index: int) -> None:
    """Run one block in `work`; pytest.fail naming the block, its code and its output when it fails."""
    code = install_rest(block) if "install" in block.needs else block.code
    if block.lang == "bash":
        script = scripts / f"{index:02d}.sh"
        script.write_text(code)
        argv = ["bash", "-e", "-o", "pipefail", str(script)]
    else:
        argv = [sys.executable, "-c", code]
    try:
        proc = subprocess.run(
            argv,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{block.where}: {block.lang} block ran past {BLOCK_TIMEOUT_S} s\n{block.code}\n{exc.stdout}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{block.where}: {block.lang} block exited {proc.returncode}\n--- block\n{block.code}"
            f"--- stdout (tail)\n{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-3000:]}",
            pytrace=False,
        )


DOCS = [path for path in documents() if runnable(path)]  # pages without bash/python blocks: nothing to run


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_every_block_of_the_document_runs(path: Path, tmp_path: Path, request) -> None:
    blocks = runnable(path)
    work, env = _scratch(tmp_path)
    scripts = tmp_path / "blocks"
    scripts.mkdir()
    ci_run = (REPO / ".ci" / "run").read_text().splitlines()
    skipped: list[str] = []
    s3_env: dict[str, str] | None = None
    for index, block in enumerate(blocks):
        unknown = set(block.needs) - set(NEEDS)
        assert not unknown, f"{block.where}: unknown `# needs:` {sorted(unknown)} (known: {', '.join(NEEDS)})"
        if "ci" in block.needs:
            commands = [line for line in block.code.splitlines() if line.strip() and not line.startswith("#")]
            for command in commands:
                assert command in ci_run, f"{block.where}: .ci/run does not run {command!r} verbatim"
            continue
        if "vllm" in block.needs:
            skipped.append(f"{block.where} (vllm: tests_vllm)")
            continue
        if "gpu" in block.needs and not _cuda_available():
            skipped.append(f"{block.where} (gpu)")
            continue
        if "slow" in block.needs and not request.config.getoption("--run-slow"):
            skipped.append(f"{block.where} (slow)")
            continue
        block_env = env
        if "s3" in block.needs:
            if s3_env is None:
                s3_env = _reset_bucket(request)
            block_env = {**env, **s3_env}
        run_block(block, work, block_env, scripts, index)
    if skipped:
        print(f"{path.name}: skipped {', '.join(skipped)}")


# ------------------------------------------------------------------------------ the convention itself


def test_fenced_blocks_parse_languages_lines_and_needs() -> None:
    text = "intro\n```bash\n# needs: gpu\necho hi\n```\n\n````python\nprint('```')\n````\n```text\nls\n```\n"
    blocks = fenced_blocks(text)
    assert [(b.lang, b.line, b.needs) for b in blocks] == [
        ("bash", 2, ("gpu",)),
        ("python", 7, ()),
        ("text", 10, ()),
    ]
    assert blocks[1].code == "print('```')\n"
    with pytest.raises(ValueError, match="never closed"):
        fenced_blocks("```bash\necho\n")


def test_install_blocks_must_install_this_checkout_with_known_extras() -> None:
    ok = Block(
        "d",
        1,
        "bash",
        '# needs: install\npython -m pip install torch==2.13.0 -e ".[hf]" && zerogr --help\n',
        ("install",),
    )
    assert install_rest(ok) == "zerogr --help"
    for bad in ("pip install zerogr && x", 'python -m pip install torch==2.13.0 -e ".[nope]" && x'):
        with pytest.raises(AssertionError):
            install_rest(Block("d", 1, "bash", bad + "\n", ("install",)))


def test_a_failing_block_fails_the_document(tmp_path: Path) -> None:
    work, env = _scratch(tmp_path)
    scripts = tmp_path / "blocks"
    scripts.mkdir()
    run_block(
        Block("d", 1, "bash", "zerogr --help > /dev/null\ntest -d scripts\npython -c 'import pyarrow'\n", ()),
        work,
        env,
        scripts,
        0,
    )
    for lang, code in (("bash", "true | false\necho unreachable\n"), ("python", "raise SystemExit(3)\n")):
        with pytest.raises(pytest.fail.Exception, match="exited"):
            run_block(Block("d", 1, lang, code, ()), work, env, scripts, 1)


def test_readme_setup_commands_are_what_ci_runs() -> None:
    """README set-up 2 is .ci/run's test command verbatim; set-up 1 installs this checkout and builds."""
    blocks = fenced_blocks((REPO / "README.md").read_text(), "README.md")
    ci = [b for b in blocks if "ci" in b.needs]
    install = [b for b in blocks if "install" in b.needs]
    assert (
        len(ci) == 1
        and 'python -m pip install torch==2.13.0 -e ".[dev]" && python -m pytest -q' in ci[0].code
    )
    assert len(install) == 1 and "zerogr build data/catalog.parquet --codebook-sizes" in install_rest(
        install[0]
    )


# ------------------------------------------------------------------------- what users read, nowhere else

USER_TEXT = ("README.md", "docs", "zerogr_build", "scripts", "experiments", "benchmarks", "cli.py",
             "mkdocs.yml", "docs_hooks")  # fmt: skip
_INTERNAL_LABEL = re.compile(r"\bissues?[ -]?#?\d+|\bG\d{1,2}\b(?!-)", re.IGNORECASE)


def test_no_issue_numbers_where_users_read() -> None:
    """README, docs, help texts, script docstrings and code comments never name an issue or a finding id."""
    hits = []
    for root in USER_TEXT:
        path = REPO / root
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if (
                file.suffix not in (".md", ".py", ".sh", ".toml", ".yml", ".cu", "")
                or "__pycache__" in file.parts
            ):
                continue
            for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                if m := _INTERNAL_LABEL.search(line):
                    hits.append(f"{file.relative_to(REPO)}:{number}: {m.group(0)!r}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_cli_reference_covers_every_command() -> None:
    """docs/cli.md's reference is rendered from the app: every command, each with its own --help text."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "docs_hooks" / "cli_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    import typer

    from zerogr_build.cli import app

    group = typer.main.get_command(app)
    rendered = hook.cli_reference_markdown()
    for name in group.list_commands(None):
        assert f"## zerogr {name}\n" in rendered
        assert f"Usage: zerogr {name} [OPTIONS]" in rendered
    assert hook.MARKER in (REPO / "docs" / "cli.md").read_text()


def test_blocks_run_the_interpreter_of_the_test_run(tmp_path: Path) -> None:
    """`python` in a block is this interpreter with its environment (a venv stays a venv: its prefix and
    its packages), and `zerogr` runs this checkout's code."""
    work, env = _scratch(tmp_path)
    probe = "import sys, zerogr_build; print(sys.prefix); print(zerogr_build.__file__)"
    got = subprocess.run(
        ["bash", "-c", f'python -c "{probe}"'], cwd=work, env=env, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[:2] == [sys.prefix, str(REPO / "zerogr_build" / "__init__.py")]
