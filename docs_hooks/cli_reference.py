"""mkdocs hook: docs/cli.md's reference section is rendered at build time from the Typer app itself.

Every command and command group the `zerogr` app has (new ones included, nothing to register) gets a section
with its `zerogr ... --help` text, exactly as the command prints it. So the reference cannot drift from
`--help`: there is no copy to go stale. The marker `<!-- cli-reference -->` in docs/cli.md is replaced.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MARKER = "<!-- cli-reference -->"
REPO = Path(__file__).resolve().parent.parent
WIDTH = 100


def _help_text(args: list[str]) -> str:
    """`zerogr *args --help` as the command prints it (plain text, WIDTH columns), via Typer's test runner."""
    from typer.testing import CliRunner

    from zerogr_build.cli import app

    result = CliRunner().invoke(
        app, [*args, "--help"], prog_name="zerogr", env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"}
    )
    if result.exit_code != 0:
        raise RuntimeError(f"zerogr {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    return result.output.rstrip() + "\n"


def command_paths() -> list[list[str]]:
    """Every command of the app as its argument path (["build"], ["bundle", "push"] for a group's command),
    in the order `zerogr --help` lists them; a group comes before its commands."""
    import typer

    from zerogr_build.cli import app

    root = typer.main.get_command(app)
    paths: list[list[str]] = []

    def walk(group: typer.core.TyperGroup, prefix: list[str]) -> None:
        for name, command in group.commands.items():
            if command.hidden:
                continue
            paths.append([*prefix, name])
            if isinstance(command, typer.core.TyperGroup):
                walk(command, [*prefix, name])

    walk(root, [])
    return paths


def cli_reference_markdown() -> str:
    """The reference: `zerogr --help`, then one section per command with its --help in a text fence."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # the checkout's code, not whatever zerogr is installed
    os.environ.setdefault("COLUMNS", str(WIDTH))
    parts = ["## zerogr\n", "```text\n" + _help_text([]) + "```\n"]
    for path in command_paths():
        parts.append(f"## zerogr {' '.join(path)}\n")
        parts.append("```text\n" + _help_text(path) + "```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs hook signature
    """Replace the marker in cli.md with the rendered reference (other pages pass through)."""
    if page.file.src_uri != "cli.md":
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"docs/cli.md: the marker {MARKER} is missing")
    return markdown.replace(MARKER, cli_reference_markdown())
