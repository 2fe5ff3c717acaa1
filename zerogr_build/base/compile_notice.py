"""Noticing numba compiling (not loading from its cache), so a first run can say why it is slow."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def on_first_compile(callback: Callable[[str], None]) -> Iterator[None]:
    """Call `callback(kernel name)` once, when the first numba kernel is compiled inside this block.

    Loading a kernel from numba's on-disk cache is not a compile and calls nothing, so a warm run stays
    silent. The listener is numba's "numba:compile" event, which fires before code generation starts.
    """
    from numba.core import event  # numba is a build dependency; imported here to keep module load light

    fired = threading.Event()

    class _Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            if not fired.is_set():
                fired.set()
                dispatcher = (ev.data or {}).get("dispatcher")
                callback(getattr(getattr(dispatcher, "py_func", None), "__qualname__", "kernel"))

        def on_end(self, ev: event.Event) -> None:
            pass

    with event.install_listener("numba:compile", _Listener()):
        yield
