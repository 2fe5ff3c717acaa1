"""Exceptions -> exit codes and one-line messages on stderr; library warnings shown on stderr."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings
from collections.abc import Iterator

import typer

from ..base.errors import ZerogrError, one_line
from ..base.printable import safe_text
from ._render import stderr_console
from ._signals import interrupt_exit_code

DEBUG_ENV = "ZEROGR_DEBUG"


def shown(exc: BaseException) -> str:
    """An exception's message as an error line shows it: one line, secrets redacted, controls escaped."""
    return safe_text(one_line(exc))


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Map exceptions to exit codes: InputError -> 2, ZerogrError -> its exit_code, anything else -> 1,
    each as one line on stderr (traceback only with ZEROGR_DEBUG=1)."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt as exc:
        sys.stderr.write(f"zerogr: {safe_text(exc or 'interrupted')}\n")
        raise typer.Exit(interrupt_exit_code(exc)) from None
    except ZerogrError as exc:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        sys.stderr.write(f"error: {shown(exc)}\n")
        raise typer.Exit(exc.exit_code) from None
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
            hint = ""
        else:
            hint = f" (set {DEBUG_ENV}=1 for a traceback)"
        sys.stderr.write(f"error: {type(exc).__name__}: {shown(exc)}{hint}\n")
        raise typer.Exit(1) from None


@contextlib.contextmanager
def warnings_on_stderr() -> Iterator[None]:
    """Show the library's warnings (e.g. inferred codebook sizes) as they happen, one line on stderr."""

    def show(message: Warning | str, *_: object, **__: object) -> None:
        stderr_console().print(f"WARNING: {safe_text(message)}", style="bold yellow", markup=False)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield
