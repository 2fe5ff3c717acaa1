"""Reading bundles: find the version dir, check the manifest and every file against it, memory-map.

Nothing in a bundle is trusted before it is checked: the manifest against the v1/v2 schema, every file name
against escaping the version dir, every file's size and (by default) sha256, every .npy header against
the dtype and shape the manifest implies. Errors are BundleError naming the file.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import BundleError
from ..index import SidIndex, StepTable
from ..index.tables import identity_leaf_offsets
from .files import HashCache, read_npy_header, read_small_file, sha256_file
from .format import (
    DEFAULT_OUT,
    ITEM_COLUMN,
    JOURNAL_NAME,
    MANIFEST_NAME,
    array_specs,
    parse_version_dir,
    validate_manifest,
)
from .versions import VersionGoneError, read_latest, resolve_bundle

HASH_THREADS = 4
# open_bundle re-reads the manifest this many times when add_bundle_files is replacing files under it.
CONCURRENT_UPDATE_RETRIES = 20
# open_bundle(OUT) resolves LATEST again this many times when the version it resolved was pruned under it.
PRUNED_RETRIES = 5
# A manifest lists a few dozen files; anything near this size is not one (and is not read).
MAX_MANIFEST_BYTES = 64 << 20


def load_manifest(version_dir: Path) -> dict:
    """Read and validate manifest.json of a version dir (schema only; files are not touched).

    The manifest is untrusted: a symlink leading out of the dir, a special file, more than
    MAX_MANIFEST_BYTES, or JSON nested too deep is refused with a BundleError naming it."""
    path = version_dir / MANIFEST_NAME
    try:
        if path.is_symlink() and not path.resolve().is_relative_to(version_dir.resolve()):
            raise BundleError(f"{path}: symlink leading outside the bundle dir")
        manifest = json.loads(read_small_file(path, MAX_MANIFEST_BYTES))
    except FileNotFoundError as exc:
        raise BundleError(f"{path}: missing") from exc
    except RecursionError:
        raise BundleError(f"{path}: not readable JSON (nested too deep)") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: not readable JSON ({exc})") from exc
    validate_manifest(manifest, str(path))
    number = parse_version_dir(version_dir.name)
    if number is not None and number != manifest["version"]:
        raise BundleError(f"{path}: version {manifest['version']} does not match dir name {version_dir.name}")
    return manifest


def bundle_file(version_dir: Path, name: str) -> Path:
    """version_dir/name after checking it is a regular file inside version_dir (symlinks may not lead
    out). `name` must already have passed format.check_relpath."""
    path = version_dir / name
    try:
        real = path.resolve(strict=True)
    except (FileNotFoundError, RuntimeError) as exc:
        raise BundleError(f"{path}: missing (listed in {MANIFEST_NAME})") from exc
    if not real.is_relative_to(version_dir.resolve()):
        raise BundleError(f"{path}: resolves outside the bundle dir (to {real})")
    if not real.is_file():
        raise BundleError(f"{path}: not a regular file")
    return path


def check_files(
    version_dir: Path, manifest: dict, verify_checksums: bool = True, hash_cache: HashCache | None = None
) -> None:
    """Every listed file exists inside the dir with the listed size (and sha256, hashed in parallel;
    through `hash_cache` when given, so a file this run hashed before and that has not changed since is
    not read again). First bad file raises."""
    entries = manifest["files"]
    paths = {name: bundle_file(version_dir, name) for name in entries}
    for name, path in paths.items():
        size = path.stat().st_size
        if size != entries[name]["bytes"]:
            raise BundleError(f"{path}: {size} bytes, manifest says {entries[name]['bytes']}")
    if not verify_checksums:
        return
    with ThreadPoolExecutor(max_workers=min(HASH_THREADS, os.cpu_count() or 1)) as pool:
        hash_file = sha256_file if hash_cache is None else hash_cache.sha256
        digests = dict(zip(paths, pool.map(hash_file, paths.values()), strict=True))
    for name, (_, digest) in digests.items():
        if digest != entries[name]["sha256"]:
            raise BundleError(f"{paths[name]}: sha256 mismatch (file changed or corrupt)")


def map_array(path: Path, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Memory-map a .npy file read-only after checking its header says exactly `dtype` and `shape` and the
    file holds exactly that many bytes after the header."""
    found_dtype, found_shape, offset = read_npy_header(path, str(path))
    if found_dtype.str != dtype:
        raise BundleError(f"{path}: dtype {found_dtype.str}, manifest implies {dtype}")
    if found_shape != tuple(shape):
        raise BundleError(f"{path}: shape {found_shape}, manifest implies {tuple(shape)}")
    expected = offset + int(np.prod(shape, dtype=np.int64)) * found_dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise BundleError(f"{path}: {size} bytes, header implies {expected}")
    if expected == offset:  # mmap cannot map zero bytes
        return np.zeros(shape, dtype=found_dtype)
    mapped = np.memmap(path, dtype=found_dtype, mode="r", offset=offset, shape=tuple(shape))
    return mapped.view(np.ndarray)  # plain ndarray (the map stays alive as its base)


def _load_checked(version_dir: Path, verify_checksums: bool, hash_cache: HashCache | None = None) -> dict:
    """Manifest + file checks, retried while a concurrent add_bundle_files swaps files and manifest."""
    manifest_path = version_dir / MANIFEST_NAME
    for attempt in range(CONCURRENT_UPDATE_RETRIES + 1):
        before = _stat_key(manifest_path)
        manifest = load_manifest(version_dir)
        try:
            check_files(version_dir, manifest, verify_checksums, hash_cache)
            return manifest
        except BundleError:
            updating = (version_dir / JOURNAL_NAME).exists() or _stat_key(manifest_path) != before
            if not updating or attempt == CONCURRENT_UPDATE_RETRIES:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _stat_key(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class Bundle:
    """An opened, checked bundle version. Arrays are read-only memory maps of the files.

    path: the version dir; version: its number; manifest: the parsed manifest.json;
    index: SidIndex over the mapped step tables (item_order None: items are stored in leaf order).
    """

    def __init__(self, path: Path, manifest: dict, index: SidIndex, items_source: Any = None):
        self.path = path
        self.manifest = manifest
        self.version: int = manifest["version"]
        self.index = index
        # items.parquet, memory-mapped at open (parsed on first use): a pruned version keeps its items.
        self._items_source = items_source

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, version={self.version}, items={self.index.num_items})"

    @property
    def model_version(self) -> str | None:
        return self.manifest["model_version"]

    def file(self, name: str) -> Path:
        """Path of a file the manifest lists (e.g. "kernels/sm_90/selective.cubin"), checked to be inside."""
        if name not in self.manifest["files"]:
            raise BundleError(f"{self.path / name}: not listed in {MANIFEST_NAME}")
        return bundle_file(self.path, name)

    def files(self, prefix: str = "") -> list[str]:
        """Names of listed files starting with `prefix` (e.g. "kernels/sm_90/"), sorted."""
        return sorted(name for name in self.manifest["files"] if name.startswith(prefix))

    def plans(self) -> dict[str, str]:
        """{device key: file name} of the tuning plans in this bundle (plans/<device-key>.json)."""
        return {
            name[len("plans/") : -len(".json")]: name
            for name in self.files("plans/")
            if name.count("/") == 1 and name.endswith(".json")
        }

    def plan(self, device_key: str) -> dict:
        """The parsed plan of one device key."""
        plans = self.plans()
        if device_key not in plans:
            raise BundleError(f"{self.path}: no plan for device {device_key!r} (have {sorted(plans)})")
        path = self.file(plans[device_key])
        try:
            return json.loads(path.read_bytes())
        except ValueError as exc:
            raise BundleError(f"{path}: not valid JSON ({exc})") from exc

    @cached_property
    def _items(self):
        import pyarrow.parquet as pq

        leaves = self.manifest["leaves"]
        path = self.path / leaves["files"]["items"]
        source = self._items_source
        if source is None:
            source = _map_items(bundle_file(self.path, leaves["files"]["items"]))
        try:
            parquet = pq.ParquetFile(source)
            # The footer's row count first: a small file must not expand to millions of rows before the
            # manifest's count refuses it.
            rows = parquet.metadata.num_rows
            if rows != leaves["items"]:
                raise BundleError(f"{path}: {rows} items, manifest says {leaves['items']}")
            if ITEM_COLUMN not in parquet.schema_arrow.names:
                raise BundleError(f"{path}: no {ITEM_COLUMN!r} column (has {parquet.schema_arrow.names[:8]})")
            table = parquet.read(columns=[ITEM_COLUMN])
        except BundleError:
            raise
        except Exception as exc:  # pyarrow raises several types for bad files
            raise BundleError(f"{path}: cannot read items ({exc})") from exc
        column = table.column(ITEM_COLUMN).combine_chunks()
        if len(column) != leaves["items"]:
            raise BundleError(f"{path}: {len(column)} items, manifest says {leaves['items']}")
        if column.null_count:
            raise BundleError(f"{path}: {column.null_count} null item ids")
        expected_type = leaves.get("item_id_type")
        if expected_type is not None and str(column.type) != expected_type:
            raise BundleError(f"{path}: item_id type {column.type}, manifest says {expected_type}")
        return column

    def items(self):
        """pyarrow Array [n_items] of item ids in leaf order (the input's type). Read on first use."""
        return self._items

    def item_ids_for_leaves(self, leaves: Any):
        """Item ids of each leaf: pyarrow ListArray, entry k = items of leaves[k] (`.to_pylist()` for
        Python lists). leaves: int array-like of leaf ids in 0..n_leaves-1 (any shape; flattened)."""
        import pyarrow as pa

        leaves = np.asarray(leaves, dtype=np.int64).reshape(-1)
        n_leaves = self.index.num_leaves
        if leaves.size and (leaves.min() < 0 or leaves.max() >= n_leaves):
            bad = leaves[(leaves < 0) | (leaves >= n_leaves)][0]
            raise IndexError(f"leaf {int(bad)} out of range 0..{n_leaves - 1}")
        values, list_offsets = self.index.leaf_items(leaves, self.items())
        return pa.LargeListArray.from_arrays(pa.array(list_offsets, type=pa.int64()), values)


def _map_items(path: Path):
    """items.parquet memory-mapped (nothing parsed yet); the map outlives a prune of its version."""
    import pyarrow as pa

    try:
        return pa.memory_map(str(path), "r")
    except (OSError, pa.ArrowException) as exc:
        raise BundleError(f"{path}: cannot read items ({exc})") from None


def open_bundle(
    path: str | Path | None = None, *, verify_checksums: bool = True, hash_cache: HashCache | None = None
) -> Bundle:
    """Open a bundle version (a version dir, or an OUT dir via LATEST; None -> "bundles").

    Validates the manifest, refuses file names that leave the version dir, checks every listed file's size
    and, unless verify_checksums=False, its sha256; memory-maps the arrays (and items.parquet) after
    checking each header's dtype and shape against the manifest. Raises BundleError naming the file,
    InputError if `path` is missing or not a bundle. Opened through an OUT dir, a version pruned between
    resolving LATEST and mapping its files is retried with the new LATEST. `hash_cache`: the run's
    HashCache (files it already hashed and that are unchanged are not hashed again).
    """
    for attempt in range(PRUNED_RETRIES + 1):
        try:
            version_dir = resolve_bundle(path)
        except VersionGoneError as exc:
            # LATEST was read, then a publish replaced it and pruned the version it named: read it again.
            if attempt == PRUNED_RETRIES or not _latest_moved_from(path, exc.name):
                raise
            continue
        try:
            return _open_version(version_dir, verify_checksums, hash_cache)
        except BundleError:
            if attempt == PRUNED_RETRIES or not _moved_on(path, version_dir):
                raise
    raise AssertionError("unreachable")


def _latest_moved_from(path: str | Path | None, name: str) -> bool:
    """True when the LATEST of OUT dir `path` now names a version other than `name`."""
    try:
        return read_latest(Path(DEFAULT_OUT if path is None else path)) != name
    except (BundleError, OSError):
        return False


def _moved_on(path: str | Path | None, version_dir: Path) -> bool:
    """True when `path` is an OUT dir whose resolved version has since vanished or been replaced."""
    try:
        if not version_dir.is_dir():
            return True
        return resolve_bundle(path) != version_dir
    except (BundleError, OSError):
        return False


def _open_version(version_dir: Path, verify_checksums: bool, hash_cache: HashCache | None = None) -> Bundle:
    try:
        manifest = _load_checked(version_dir, verify_checksums, hash_cache)
        specs = array_specs(manifest)
        arrays = {name: map_array(bundle_file(version_dir, name), *spec) for name, spec in specs.items()}
        items_source = _map_items(bundle_file(version_dir, manifest["leaves"]["files"]["items"]))
    except OSError as exc:  # a file removed or replaced between the checks and the map
        raise BundleError(f"{exc.filename or version_dir}: cannot read ({exc.strerror or exc})") from None
    steps = []
    for entry, size in zip(manifest["steps"], manifest["codebook_sizes"], strict=True):
        mapped = {role: arrays[name] for role, name in entry["files"].items()}
        steps.append(
            StepTable(
                step=entry["step"],
                codebook_size=size,
                rows=entry["rows"],
                nnz=entry["nnz"],
                max_slots=entry["max_slots"],
                indptr=mapped.get("indptr"),
                tokens=mapped.get("tokens"),
                next=mapped.get("next"),
            )
        )
    leaves = manifest["leaves"]
    if "offsets" in leaves["files"]:
        leaf_offsets = arrays[leaves["files"]["offsets"]]
    else:  # v2, one item per leaf: leaf j is item j (validate_manifest checked count == items)
        leaf_offsets = identity_leaf_offsets(leaves["count"])
    index = SidIndex(
        codebook_sizes=tuple(manifest["codebook_sizes"]),
        steps=tuple(steps),
        leaf_offsets=leaf_offsets,
        item_order=None,
    )
    return Bundle(version_dir, manifest, index, items_source)
