"""The `zerogr` command line (Typer). This module only wires the commands; each lives in its own module.

    build.py    build, promote          bundle.py   inspect, verify
    tune.py     tune                    compare.py  compare
    fleet.py    push, pull, status      rebuild.py  rebuild (cron: build -> ... -> promote -> push)
    keys.py     keys new (signing keys) report.py   report (HTML page of the last versions)
    config.py   config --show-defaults  demo.py     demo-catalog
    _options.py shared option aliases   _errors.py  exception -> exit code, warnings on stderr
    _usage.py   plain usage lines
    _progress.py progress renderers     _render.py  rich tables and consoles

Each command parses its options and calls the library inside `with cli_errors():`. Output discipline:
results go to stdout (a table, or one JSON object with --json); progress, warnings and errors go to stderr.
Exit codes: 0 ok; 2 bad input or usage (one line naming file/column/row/item, nothing published); 1 anything
else (one line; set ZEROGR_DEBUG=1 for the traceback); 10 `compare --min-overlap`: the quality gate failed.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .. import __version__
from ._usage import UsageGroup
from .build import build, promote
from .bundle import inspect, verify
from .compare import compare
from .config import config
from .demo import demo_catalog
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
    published); 1 anything else (set ZEROGR_DEBUG=1 for a traceback); 10 the quality gate of
    `compare --min-overlap` failed.
    """


app.command()(build)
app.command()(inspect)
app.command()(verify)
app.command()(promote)
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


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`zerogr`), also used by the repo-root `cli.py` shim."""
    app(args=argv, prog_name="zerogr")
