"""The `zerogr` command line (Typer). This module only wires the commands; each lives in its own module.

    build.py    build, promote          bundle.py   inspect, verify
    tune.py     tune                    compare.py  compare
    fleet.py    push, pull, status      rebuild.py  rebuild (cron: build -> ... -> promote -> push)
    keys.py     keys new (signing keys) report.py   report (HTML page of the last versions)
    config.py   config --show-defaults  demo.py     demo-catalog
    _app.py     the Typer app           _signals.py SIGTERM/SIGHUP: at start-up, and as Ctrl-C in a command
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
from typing import Any

from ._signals import install_startup_handlers


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`zerogr`), also used by `python -m zerogr_build.cli` and the repo-root
    `cli.py` shim. SIGTERM and SIGHUP are handled from here on, before the commands' heavy imports
    (numpy, pyarrow, numba): a signal during start-up writes --metrics-file (read from the arguments) and
    exits 128 + N (cli/_signals.py). The handlers stay for the life of the process."""
    install_startup_handlers(sys.argv[1:] if argv is None else argv)
    from ._app import app

    app(args=argv, prog_name="zerogr")


def __getattr__(name: str) -> Any:
    """`app` (the Typer app, for typer.testing.CliRunner) loads on first use."""
    if name == "app":
        from ._app import app

        return app
    raise AttributeError(f"module 'zerogr_build.cli' has no attribute {name!r}")
