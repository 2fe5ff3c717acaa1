"""The engine's side of the registry: every catalog opened at start, then what requests derive from it.

    catalogs = EngineCatalogs(registry, device, vocab_size)   # opens every registered catalog now
    plan = catalogs.plan(spec, pin)       # a request's version, SID map, masks and item filter, all checked
    plan.masks                            # VocabMasks of that version, built when the version was opened

At start each catalog's live version is opened (memory-mapped, checked) with its SID map (checked against
the model's vocabulary), its item sets and its availability; the engine fails to start, naming the file,
if one is broken. When a follow catalog's LATEST moves, LiveVersions' thread opens the new version here
(prepare: checksums, the SID map against the version and the vocabulary, the masks, the device tables),
and only then announces it to the front end (announce.py); a version that fails is refused, logged, and
the last good one keeps serving. Nothing is opened, hashed or masked on the engine's step loop: a request
decodes the version admission pinned (admission.PIN_KEY) only if this engine holds it open and accepted,
else its live one when there is no pin; any other pin fails that request alone.

Every cache is bounded (lru.Lru) and keyed by what the bytes are, never by how a request spelled a path:
versions by real path and manifest identity (limits.open_versions, plus the serving ones and those live
requests hold), per version its vocabulary masks and item filters (limits.filters_per_version), files by
(st_dev, st_ino, size, mtime_ns). The catalog's availability file is read again when it changes; its SID
map and item sets are read once, at start. A request's own file is the one admission opened and checked
(registry.RequestFile: its root, name and identity): found in the cache by that identity without a
filesystem call, else opened again by the same name and read only if it is still that file, within
limits.request_ids rows and limits.request_file_bytes decoded; the cache holds at most
limits.request_file_cache_bytes of ids.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...base.errors import InputError
from ...bundle import open_bundle
from ...bundle.format import MANIFEST_NAME
from ...runtime.device_tables import DeviceStep, index_to_device
from ...runtime.items.constraints import ItemMask, ItemSets, item_ids
from ...runtime.items.files import read_available_ids, read_set_memberships
from ...runtime.items.requests import RequestConstraints, request_constraints
from ...runtime.items.space import ItemSpace, Resident, SetBits, make_resident
from ..sid_map import SidMap, catalog_token_table
from ..vocab_masks import VocabMasks
from .announce import Announced, EngineBoard
from .live import LiveVersions
from .lru import Lru
from .registry import CatalogEntry, FileRefusal, Limits, Registry, RequestFile, file_identity
from .spec import RequestSpec

logger = logging.getLogger("vllm.zerogr")
MASKS_PER_VERSION = 4  # (SID map, vocabulary width, device) combinations of one version
REQUEST_FILES = 8  # request-named availability files kept read


@contextmanager
def logged_warnings() -> Iterator[None]:
    """Warnings raised inside (ids a version lacks, ignored) go to the server log, one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        logger.warning("zerogr: %s", warning.message)


class Catalog:
    """One opened bundle version and what requests derive from it (device tables, vocabulary masks, item
    filters), each built on first use and kept in a bounded cache."""

    def __init__(self, version_dir: Path, limits: Limits, key: tuple = ()) -> None:
        self.key = key  # EngineCatalogs' cache key: (real path, manifest identity)
        self.bundle = open_bundle(version_dir)
        self.index = self.bundle.index
        self.path = self.bundle.path
        self.ids = item_ids(self.bundle)
        self._lock = threading.RLock()
        self._steps: dict[torch.device, tuple[DeviceStep, ...]] = {}
        self._spaces: dict[torch.device, ItemSpace] = {}
        self._tables: Lru[tuple[np.ndarray, ...]] = Lru(MASKS_PER_VERSION)
        self._masks: Lru[VocabMasks] = Lru(MASKS_PER_VERSION)
        self._filters: Lru[Resident] = Lru(limits.filters_per_version)

    def __repr__(self) -> str:
        return f"Catalog({str(self.path)!r}, version={self.bundle.version})"

    def steps(self, device: torch.device) -> tuple[DeviceStep, ...]:
        """The step tables on `device` (the Decoder's layout)."""
        with self._lock:
            if device not in self._steps:
                self._steps[device] = index_to_device(self.index, device)
            return self._steps[device]

    def token_table(self, sid_map: SidMap, key: tuple) -> tuple[np.ndarray, ...]:
        """catalog_token_table of a SID map (checked to spell every code the catalog uses), cached by key."""
        return self._tables.get_or_make(key, lambda: catalog_token_table(sid_map, self.index))

    def masks(self, sid_map: SidMap, key: tuple, vocab_size: int, device: torch.device) -> VocabMasks:
        """VocabMasks of this version for one SID map and vocabulary width, on `device`."""

        def make() -> VocabMasks:
            return VocabMasks(self.index, self.token_table(sid_map, key), vocab_size, device)

        return self._masks.get_or_make((key, int(vocab_size), device), make)

    def built_masks(self, key: tuple, vocab_size: int, device: torch.device) -> VocabMasks:
        """The VocabMasks masks() built for this SID map key (InputError if none: they are built when the
        version is opened, never for a request)."""
        masks = self._masks.get((key, int(vocab_size), device))
        if masks is None:
            raise InputError(f"{self.path.name}: no vocabulary masks built for this SID map and vocabulary")
        return masks

    def space(self, device: torch.device) -> ItemSpace:
        """The Decoder's item space of this version on `device` (its step tables there)."""
        with self._lock:
            if device not in self._spaces:
                self._spaces[device] = ItemSpace(self.bundle, self.steps(device), device)
            return self._spaces[device]

    def item_filter(
        self, key: tuple, mask: Callable[[], ItemMask | None], sets: Callable[[], ItemSets | None], device
    ) -> Resident:
        """The Decoder's resident item state for the availability mask() and item sets sets() make, cached
        under `key` (what they are made from)."""

        def make() -> Resident:
            space = self.space(device)
            with logged_warnings():
                item_sets = sets()
                bits = None if item_sets is None else SetBits.build(item_sets)
                return make_resident(space, mask(), bits)

        return self._filters.get_or_make((key, device), make)


@dataclass(frozen=True, eq=False)
class RequestPlan:
    """A request's resolved arguments: the version, the SID map, and its item filter (None: every SID of
    the catalog is allowed)."""

    spec: RequestSpec
    catalog: Catalog
    sid_map: SidMap
    sid_key: tuple
    masks: VocabMasks
    resident: Resident | None

    def constraints(self, plans: list[RequestPlan]) -> RequestConstraints:
        """The RequestConstraints of `plans` (all on this plan's resident), one request each, in order.
        Excluded ids this version lacks are ignored (logged), as Decoder.search does."""
        include = [list(p.spec.include) if p.spec.include else None for p in plans]
        exclude = [list(p.spec.exclude) if p.spec.exclude else None for p in plans]
        assert self.resident is not None
        with logged_warnings():
            return request_constraints(self.resident, self.catalog.ids, include, exclude, len(plans))


class EngineCatalogs:
    """Every registered catalog, opened in the engine (module docstring)."""

    def __init__(self, registry: Registry, device: torch.device, vocab_size: int) -> None:
        self.registry = registry
        self.device = device
        self.vocab_size = int(vocab_size)
        self._lock = threading.RLock()
        self._versions: Lru[Catalog] = Lru(registry.limits.open_versions)
        self._sid_maps: dict[str, tuple[SidMap, tuple]] = {}
        self._set_rows: dict[str, tuple[np.ndarray, Any, str, tuple]] = {}
        self._availability: dict[str, tuple[tuple, Any]] = {}
        self._request_files: Lru[Any] = Lru(
            REQUEST_FILES, registry.limits.request_file_cache_bytes, weight=lambda ids: ids.nbytes
        )
        self._serving: dict[str, Catalog] = {}  # catalog -> the version new requests without a pin decode
        self._held: dict[str, dict[str, tuple]] = {}  # catalog -> {version dir name: key in _versions}
        for name, entry in registry.catalogs.items():
            sid_map = SidMap.load(entry.sid_map)
            self._sid_maps[name] = (sid_map, ("sid_map", *file_identity(os.stat(entry.sid_map))))
            if entry.item_sets is not None:
                names, ids, what = read_set_memberships(entry.item_sets, "set", "item_id")
                self._set_rows[name] = (names, ids, what, file_identity(os.stat(entry.item_sets)))
            if entry.availability is not None:
                self._registered_availability(entry)
        self.board = EngineBoard(registry)
        self.live = LiveVersions(registry, on_change=self.prepare)
        for name in registry.catalogs:
            self.prepare(name, self.live.current(name))
        atexit.register(self.close)

    def close(self) -> None:
        """Stop following LATEST and withdraw this process's record."""
        self.live.close()
        self.board.close()

    def prepare(self, name: str, version_dir: Path) -> Catalog:
        """Open `version_dir` of catalog `name`, check it and build what its requests use (its vocabulary
        masks, with the SID map checked against the version and the model's vocabulary; its device tables
        and item space; the catalog's availability filter), then serve it and announce it to the front
        end. Runs at start and on LiveVersions' thread, never on the step loop; InputError / BundleError
        when the version is refused (the last good one stays)."""
        sid_map, sid_key = self._sid_maps[name]
        catalog = self.version(version_dir)
        sid_map.check_vocabulary(catalog.index.codebook_sizes, self.vocab_size)
        catalog.masks(sid_map, sid_key, self.vocab_size, self.device)
        catalog.space(self.device)
        entry = self.registry.catalogs[name]
        if entry.availability is not None:
            self._filter(entry, RequestSpec(catalog=name), catalog)
        with self._lock:
            self._serving[name] = catalog
            held = self._held.setdefault(name, {})
            held[catalog.path.name] = catalog.key
            for old, key in list(held.items()):
                if old != catalog.path.name and key not in self._versions:
                    del held[old]
            self.board.write({n: self._announced(n) for n in self._serving})
        return catalog

    def _announced(self, name: str) -> Announced:
        """What this engine holds of catalog `name`: its serving version, and the accepted ones still open."""
        serving = self._serving[name].path
        held = [key[0] for key in self._held[name].values() if key in self._versions]
        return Announced(serving, tuple(dict.fromkeys([*held, serving])))

    def version(self, version_dir: Path) -> Catalog:
        """The Catalog of a version dir (real path), opened once while it stays cached (keyed by the path and
        its manifest's identity: a version dir made again under the same name is opened again)."""
        key = (version_dir, *file_identity(os.stat(version_dir / MANIFEST_NAME)))
        return self._versions.get_or_make(key, lambda: Catalog(version_dir, self.registry.limits, key))

    def held(self, name: str, pin: str | None) -> Catalog:
        """The opened version a request of catalog `name` decodes: `pin` (a version dir name admission
        chose) when this engine holds it open and accepted, the serving version when there is no pin;
        InputError otherwise (nothing is opened here)."""
        serving = self._serving[name]
        if pin is None or pin == serving.path.name:
            return serving
        with self._lock:
            key = self._held.get(name, {}).get(pin)
            catalog = None if key is None else self._versions.peek(key)
        if catalog is None:
            raise InputError(
                f"catalog {name!r}: version {pin[:80]!r} is not open in this engine (it serves "
                f"{serving.path.name}); the request ends"
            )
        return catalog

    def plan(self, spec: RequestSpec, pin: str | None, file: str | None = None) -> RequestPlan:
        """Everything a request needs, every rule checked: InputError / BundleError naming the first broken
        one (for the server log). `file`: the RequestFile token admission wrote for a request's file."""
        entry = self.registry.catalogs.get(spec.catalog)
        if entry is None:
            raise InputError(f"unknown catalog {spec.catalog!r}")
        catalog = self.held(spec.catalog, pin)
        sid_map, sid_key = self._sid_maps[spec.catalog]
        masks = catalog.built_masks(sid_key, self.vocab_size, self.device)
        resident = None
        if spec.constrained or entry.availability is not None:
            resident = self._filter(entry, spec, catalog, file)
            if spec.include:
                assert resident.set_bits is not None
                resident.set_bits.sets.lookup(list(spec.include))  # unknown set names
        return RequestPlan(spec, catalog, sid_map, sid_key, masks, resident)

    def _filter(self, entry: CatalogEntry, spec: RequestSpec, catalog: Catalog, file: str | None) -> Resident:
        """The resident item filter of a request: the catalog's availability AND the request's, the
        catalog's item sets when the request names sets."""
        registered = self._registered_availability(entry) if entry.availability is not None else None
        requested: tuple[tuple, Any] | None = None
        if isinstance(spec.available, str):
            requested = self._request_file(spec.available, file)
        elif spec.available is not None:
            requested = (("ids", spec.available), list(spec.available))
        rows = self._set_rows.get(entry.name) if spec.include else None
        if spec.include and rows is None:
            raise InputError(f'catalog {entry.name!r} has no item sets to "include"')
        key = (
            None if registered is None else registered[0],
            None if requested is None else requested[0],
            None if rows is None else rows[3],
        )

        def mask() -> ItemMask | None:
            held = [ids for ids in (registered, requested) if ids is not None]
            parts = [ItemMask.from_ids(catalog.bundle, ids).available for _, ids in held]
            if not parts:
                return None
            return ItemMask.from_bool(catalog.bundle, np.logical_and.reduce(parts))

        def sets() -> ItemSets | None:
            return None if rows is None else ItemSets.from_memberships(catalog.bundle, *rows[:3])

        return catalog.item_filter(key, mask, sets, self.device)

    def _registered_availability(self, entry: CatalogEntry) -> tuple[tuple, Any]:
        """(identity, ids) of the catalog's availability file, read again when it has changed."""
        assert entry.availability is not None
        identity = ("registered", *file_identity(os.stat(entry.availability)))
        with self._lock:
            held = self._availability.get(entry.name)
            if held is None or held[0] != identity:
                ids, _what = read_available_ids(entry.availability)
                held = self._availability[entry.name] = (identity, ids)
            return held

    def _request_file(self, text: str, token: str | None) -> tuple[tuple, Any]:
        """(identity, ids) of the availability file a request names: the one admission found (`token`),
        else (no admission in between) the name opened here with admission's checks."""
        if token is None:
            found = self.registry.open_request_file(text)
            if isinstance(found, FileRefusal):
                raise InputError(f"request file refused: {found.reason}")
            fd, file = found
        else:
            try:
                file = RequestFile.from_token(token)
            except ValueError:
                raise InputError("a request file token that admission did not write") from None
            fd = None
        identity = ("file", *file.identity)
        cached = self._request_files.get(identity)
        if cached is not None:
            if fd is not None:
                os.close(fd)
            return identity, cached
        if fd is None:
            fd = self.registry.reopen_request_file(file)
        limits = self.registry.limits
        try:
            where = self.registry.allow_paths_under[file.root] / file.name
            ids, _what = read_available_ids(
                where, fd=fd, max_rows=limits.request_ids, max_bytes=limits.request_file_bytes
            )
        finally:
            os.close(fd)
        return identity, self._request_files.put(identity, ids)


__all__ = ["Catalog", "EngineCatalogs", "RequestPlan", "logged_warnings"]
