"""The bundles, SID maps and item filters of one process, opened once and shared by every request.

    version_dir = version_for(spec)              # the version a new request uses (see "follow")
    plan = prepare(spec, device)                 # everything a request needs, every rule checked
    plan.catalog.masks(plan.sid_map, vocab, device)   # VocabMasks of that version, SID map and vocabulary

Bundles are opened by version dir (memory-mapped, checked once) and cached by it, so requests naming the same
version share one copy, and a new version is opened beside the old one. An OUT dir is resolved to the version
its LATEST names: once per process (the first time a request names it), or for every new request when the
request says "follow": true. A request keeps the version it was resolved to for its whole life.
Files named by requests (SID maps, item sets, availability) are cached by (path, size, mtime): an updated
file is read again, an unchanged one never.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...base.errors import InputError
from ...bundle import open_bundle, resolve_bundle
from ...bundle.format import MANIFEST_NAME
from ...runtime.device_tables import DeviceStep, index_to_device
from ...runtime.items.constraints import ItemMask, ItemSets, item_ids
from ...runtime.items.requests import RequestConstraints, request_constraints
from ...runtime.items.space import ItemSpace, Resident, SetBits, make_resident
from ..sid_map import SidMap, catalog_token_table
from ..vocab_masks import VocabMasks
from .spec import RequestSpec

MAX_VERSIONS = 4  # bundle versions kept open beyond those that live requests hold
MAX_FILTERS = 16  # (availability, item sets) combinations kept per version
_LOCK = threading.RLock()
_VERSIONS: OrderedDict[Path, Catalog] = OrderedDict()
_FIXED: dict[str, Path] = {}  # OUT dir -> the version it resolved to (requests without "follow")
_SID_MAPS: dict[tuple, tuple[SidMap, tuple]] = {}


def _file_key(path: str) -> tuple:
    """(absolute path, size, mtime_ns) of a regular file; InputError naming it otherwise."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a regular file")
    return (os.path.abspath(path), st.st_size, st.st_mtime_ns)


class Catalog:
    """One opened bundle version and what requests derive from it (device tables, vocabulary masks, item
    filters), each built on first use."""

    def __init__(self, version_dir: Path) -> None:
        self.bundle = open_bundle(version_dir)
        self.index = self.bundle.index
        self.path = self.bundle.path
        self.ids = item_ids(self.bundle)
        self._steps: dict[torch.device, tuple[DeviceStep, ...]] = {}
        self._spaces: dict[torch.device, ItemSpace] = {}
        self._masks: dict[tuple, VocabMasks] = {}
        self._filters: OrderedDict[tuple, Resident] = OrderedDict()
        self._tables: dict[tuple, tuple[np.ndarray, ...]] = {}

    def __repr__(self) -> str:
        return f"Catalog({str(self.path)!r}, version={self.bundle.version})"

    def steps(self, device: torch.device) -> tuple[DeviceStep, ...]:
        """The step tables on `device` (the Decoder's layout)."""
        with _LOCK:
            if device not in self._steps:
                self._steps[device] = index_to_device(self.index, device)
            return self._steps[device]

    def token_table(self, sid_map: SidMap, key: tuple) -> tuple[np.ndarray, ...]:
        """catalog_token_table of a SID map (checked to spell every code the catalog uses), cached by key."""
        with _LOCK:
            if key not in self._tables:
                self._tables[key] = catalog_token_table(sid_map, self.index)
            return self._tables[key]

    def masks(self, sid_map: SidMap, key: tuple, vocab_size: int, device: torch.device) -> VocabMasks:
        """VocabMasks of this version for one SID map and vocabulary width, on `device`."""
        with _LOCK:
            cache_key = (key, int(vocab_size), device)
            if cache_key not in self._masks:
                table = self.token_table(sid_map, key)
                self._masks[cache_key] = VocabMasks(self.index, table, vocab_size, device)
            return self._masks[cache_key]

    def item_filter(self, available: Any, item_sets: str | None, device: torch.device) -> Resident:
        """The Decoder's resident item state for one availability (None, a Parquet file, a tuple of ids)
        and one item sets file (or None), on `device`; ids not in the catalog are refused."""
        avail_key = ("file", *_file_key(available)) if isinstance(available, str) else available
        sets_key = None if item_sets is None else _file_key(item_sets)
        key = (avail_key, sets_key, device)
        with _LOCK:
            cached = self._filters.get(key)
            if cached is not None:
                self._filters.move_to_end(key)
                return cached
            if device not in self._spaces:
                self._spaces[device] = ItemSpace(self.bundle, self.steps(device), device)
            mask = None
            if isinstance(available, str):
                mask = ItemMask.from_parquet(self.bundle, available)
            elif available is not None:
                mask = ItemMask.from_bool(self.bundle, self._known(available, "available"))
            sets = None if item_sets is None else SetBits.build(ItemSets.from_parquet(self.bundle, item_sets))
            resident = self._filters[key] = make_resident(self._spaces[device], mask, sets)
            while len(self._filters) > MAX_FILTERS:
                self._filters.popitem(last=False)
            return resident

    def _known(self, ids: tuple, key: str) -> np.ndarray:
        """bool [items] in the items table's order: the positions of ids, every one in the catalog."""
        found = self.ids.lookup(list(ids), f'extra_args["zerogr"]["{key}"]')
        if (found < 0).any():
            bad = ids[int(np.flatnonzero(found < 0)[0])]
            raise InputError(
                f'extra_args["zerogr"]["{key}"]: item id {bad!r} is not in the catalog ({self.path})'
            )
        out = np.zeros(self.index.num_items, dtype=bool)
        out[found] = True
        return out


def open_catalog(version_dir: Path) -> Catalog:
    """The Catalog of a version dir, opened once per process (the newest MAX_VERSIONS stay cached)."""
    with _LOCK:
        catalog = _VERSIONS.get(version_dir)
        if catalog is None:
            catalog = _VERSIONS[version_dir] = Catalog(version_dir)
            while len(_VERSIONS) > MAX_VERSIONS:
                _VERSIONS.popitem(last=False)  # requests still on it keep their reference
        else:
            _VERSIONS.move_to_end(version_dir)
        return catalog


def version_for(spec: RequestSpec) -> Path:
    """The version dir a new request of `spec` uses: its LATEST now ("follow"), else the version the OUT
    dir resolved to the first time this process saw it (a version dir is itself)."""
    path = os.path.abspath(spec.bundle)
    if spec.follow:
        if (Path(path) / MANIFEST_NAME).exists():
            raise InputError(f'{spec.bundle}: "follow" needs an OUT dir (this is a version dir)')
        return resolve_bundle(path).resolve()
    with _LOCK:
        if path not in _FIXED:
            _FIXED[path] = resolve_bundle(path).resolve()
        return _FIXED[path]


def load_sid_map(path: str) -> tuple[SidMap, tuple]:
    """(SidMap, its cache key) of a file SidMap.save wrote, read again only when the file changes."""
    key = _file_key(path)
    with _LOCK:
        if key not in _SID_MAPS:
            _SID_MAPS[key] = (SidMap.load(path), key)
        return _SID_MAPS[key]


@dataclass(frozen=True, eq=False)
class RequestPlan:
    """A request's resolved arguments: the version, the SID map, and its item filter (None: every SID of
    the catalog is allowed)."""

    spec: RequestSpec
    catalog: Catalog
    sid_map: SidMap
    sid_key: tuple
    resident: Resident | None

    def constraints(self, plans: list[RequestPlan]) -> RequestConstraints:
        """The RequestConstraints of `plans` (all on this plan's resident), one request each, in order."""
        include = [list(p.spec.include) if p.spec.include else None for p in plans]
        exclude = [list(p.spec.exclude) if p.spec.exclude else None for p in plans]
        assert self.resident is not None
        return request_constraints(self.resident, self.catalog.ids, include, exclude, len(plans))


def prepare(spec: RequestSpec, device: torch.device, version_dir: Path | None = None) -> RequestPlan:
    """Open (or reuse) everything `spec` names and check every rule: InputError / BundleError naming the
    first broken one. version_dir: the version to use (default: version_for(spec))."""
    catalog = open_catalog(version_dir if version_dir is not None else version_for(spec))
    sid_map, sid_key = load_sid_map(spec.sid_map)
    catalog.token_table(sid_map, sid_key)  # every code spelt, EOS distinct
    resident = None
    if spec.constrained:
        resident = catalog.item_filter(spec.available, spec.item_sets if spec.include else None, device)
        if spec.include:
            assert resident.set_bits is not None
            resident.set_bits.sets.lookup(list(spec.include))  # unknown set names
        if spec.exclude:
            catalog._known(spec.exclude, "exclude")
    return RequestPlan(spec, catalog, sid_map, sid_key, resident)


__all__ = ["Catalog", "RequestPlan", "load_sid_map", "open_catalog", "prepare", "version_for"]
