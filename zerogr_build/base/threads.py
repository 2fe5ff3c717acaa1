"""A generic helper thread: run an iterator one item ahead of its consumer."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


def prefetched(items: Iterator[T], depth: int = 1, *, name: str = "zerogr-prefetch") -> Iterator[T]:
    """Produce the next items of `items` on a helper thread (named `name`) while the caller handles the
    current one: worth it when producing releases the GIL (Arrow decoding a batch, file reads). At most
    `depth` produced items wait, so memory stays bounded. An exception raised by `items` is re-raised in
    the caller at the item where it occurred. Closing the generator (or an error in the caller) stops and
    joins the thread before returning."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            slots.put(exc)

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item = slots.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue, then let it finish
            with contextlib.suppress(queue.Empty):
                slots.get(timeout=0.1)
        worker.join()
