"""The `zerogr` Typer app: every command wired under its name (cli/__init__.py's `main` runs it)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..base.version import __version__
from ._usage import UsageGroup
from .build import build, promote
from .bundle import inspect, verify
from .compare import compare
from .config import config
from .demo import demo_catalog
from .diff import diff
from .fleet import pull, push, status
from .keys import keys_app
from .rebuild import COMMAND_SETTINGS as REBUILD_SETTINGS
from .rebuild import rebuild
from .report import report
from .tune import tune

app = typer.Typer(
    name="zerogr",
    cls=UsageGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"zerogr {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Build, inspect and verify per-step constrained-decoding indexes for generative recommenders.

    Exit codes: 0 ok; 2 bad input or usage (one line naming file, column, row and item; nothing
    published); 1 anything else (set ZEROGR_DEBUG=1 for a traceback); 6 the guards refused a version
    (`build --guards`, `promote --guards`); 10 the quality gate of `compare --min-overlap` failed.
    """


app.command()(build)
app.command()(inspect)
app.command()(verify)
app.command()(promote)
app.command()(diff)
app.command()(tune)
app.command()(compare)
app.command()(push)
app.command()(pull)
app.command()(status)
app.add_typer(keys_app)
app.command(**REBUILD_SETTINGS)(rebuild)
app.command()(report)
app.command()(config)
app.command("demo-catalog")(demo_catalog)
