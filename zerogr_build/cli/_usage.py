"""Usage lines in the plain form `--help` readers expect: `zerogr build [OPTIONS] CATALOG`.

Typer writes a required argument as `{CATALOG}` in the usage line; every command of the app (those added
later included) is given a command class that writes it bare, as click and man pages do.
"""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperCommand, TyperGroup

_BRACED = re.compile(r"^\{(.+)\}(\.\.\.)?$")


class UsageCommand(TyperCommand):
    """TyperCommand whose usage line names required arguments bare (CATALOG, not {CATALOG})."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [_BRACED.sub(r"\1\2", piece) for piece in super().collect_usage_pieces(ctx)]


class UsageGroup(TyperGroup):
    """The app's command group: its plain Typer commands, and those of sub-groups, become UsageCommands
    (same state, one method more), so a command registered with a bare `app.command()` or in an
    `app.add_typer(...)` group gets the plain usage line too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_usage(self)


def _plain_usage(group: Any) -> None:
    for command in group.commands.values():
        if type(command) is TyperCommand:
            command.__class__ = UsageCommand
        elif isinstance(command, TyperGroup):
            _plain_usage(command)
