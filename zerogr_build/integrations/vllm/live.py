"""Which version of each registered catalog new requests decode, known without touching a file per request.

    live = LiveVersions(registry, on_change=prepare_version)   # resolves every catalog now (raises if one
    live.current("movies")   # -> Path of the version dir          cannot be resolved)
    live.close()

A catalog whose bundle is a version dir, or an OUT dir without "follow", keeps the version it resolved to
at start. For a "follow" catalog a daemon thread reads the OUT dir's LATEST every poll_seconds; when it
names another version, current() answers the new one from then on and on_change(name, version_dir) runs in
that thread (the engine opens the new version there, off its step loop). A LATEST that cannot be read or
names a broken version is logged once and the last good version stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from ...base.errors import ZerogrError, one_line
from ...bundle import resolve_bundle
from .registry import CatalogEntry, Registry

logger = logging.getLogger("vllm.zerogr")


def resolve_entry(entry: CatalogEntry) -> Path:
    """The real path of the version dir a catalog's bundle names now (InputError / BundleError if none)."""
    return resolve_bundle(entry.bundle).resolve()


class LiveVersions:
    """The version dir per catalog name that new requests use (module docstring)."""

    def __init__(self, registry: Registry, on_change: Callable[[str, Path], None] | None = None) -> None:
        self._entries = registry.catalogs
        self._current = {name: resolve_entry(entry) for name, entry in self._entries.items()}
        self._on_change = on_change
        self._poll_seconds = registry.poll_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: dict[str, str] = {}
        if any(entry.follow for entry in self._entries.values()):
            self._thread = threading.Thread(target=self._watch, name="zerogr-latest", daemon=True)
            self._thread.start()

    def current(self, name: str) -> Path:
        """The version dir of catalog `name` that a new request decodes."""
        return self._current[name]

    def poll(self) -> None:
        """Read every follow catalog's LATEST once (what the thread does every poll_seconds)."""
        for name, entry in self._entries.items():
            if not entry.follow:
                continue
            try:
                version = resolve_entry(entry)
                if version != self._current[name] and self._on_change is not None:
                    self._on_change(name, version)  # the new version must open before it is served
            except (ZerogrError, OSError) as exc:
                message = one_line(exc)
                if self._reported.get(name) != message:
                    self._reported[name] = message
                    logger.warning("zerogr: catalog %r keeps %s: %s", name, self._current[name].name, message)
                continue
            self._reported.pop(name, None)
            if version != self._current[name]:
                self._current[name] = version
                logger.info("zerogr: catalog %r now serves %s", name, version.name)

    def close(self) -> None:
        """Stop the thread (the versions known so far stay readable)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad version
                logger.exception("zerogr: reading the catalogs' LATEST failed")


__all__ = ["LiveVersions", "resolve_entry"]
