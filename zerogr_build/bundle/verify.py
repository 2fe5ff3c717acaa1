"""`verify_bundle`: checksums, every structural invariant of the format, and (given the catalog) exact
equality of the bundle's SIDs and item mapping with it. The first failure raises BundleError naming the
file; success returns a report dict."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import BundleError
from ..index.formats import bits_for
from .files import HashCache
from .format import JOURNAL_NAME, MANIFEST_NAME, SIGNATURE_NAME
from .kernel_files import KERNEL_HEAD_BYTES, kernel_problem
from .quality import QUALITY_DIR, load_quality, quality_key
from .reader import Bundle, open_bundle
from .verify_math import stable_argsort_keys
from .witness import BuildWitness, witness_report

#: Entries of a table that the structural checks look at together.
CHECK_CHUNK = 1 << 20

_KERNEL_NAME = re.compile(r"^kernels/(sm_\d{2,3}[af]?)/[A-Za-z0-9_]+\.(cubin|ptx)$")


def verify_bundle(
    path: str | Path | None = None,
    catalog: Any = None,
    *,
    checksums: bool = True,
    hash_cache: HashCache | None = None,
    witness: BuildWitness | None = None,
) -> dict:
    """Verify a bundle version completely (a version dir, or an OUT dir via LATEST).

    checksums: False skips hashing the files (sizes are still checked), for a caller that has just
    checked every sha256 itself (`pull` hashes each file as it streams it in).
    hash_cache: the run's HashCache (bundle/files.py): a file this run hashed before and that has not
    changed since (same inode, size, mtime and ctime) is not hashed again, and the structural checks of
    the step and leaf files, once passed, are not run again while those files and the manifest fields
    they read are unchanged. The catalog comparison, when asked for, always runs.
    catalog: a zerogr_build.catalog.Catalog (.sids [N, L] ints, .item_ids pyarrow Array in catalog row
    order, .codebook_sizes) to compare against, or None.
    witness: instead of `catalog`, the witness of the build that wrote this version (bundle/witness.py):
    the same exact comparison with the catalog as that build read it, without sorting it again.
    With either, the items' uniqueness check is left to that comparison (the catalog's ids are unique).
    Returns {"bundle", "version", "ok": True, "files", "bytes", "steps": [...], "leaves", "items",
    "catalog": None | {...}, "unlisted_files": [...]}.
    """
    # Through open_bundle, so an OUT dir whose LATEST moves on (and prunes) meanwhile is resolved again.
    bundle = open_bundle(path, verify_checksums=checksums, hash_cache=hash_cache)
    version_dir = bundle.path
    manifest = bundle.manifest
    structure = _structure_key(version_dir, manifest, hash_cache) if hash_cache is not None else None
    already = hash_cache is not None and hash_cache.passed(structure)
    steps_report = []
    for table, entry in zip(bundle.index.steps, manifest["steps"], strict=True):
        if not already and table.format == "sparse":
            check_sparse_step(
                table, version_dir / entry["files"]["indptr"], version_dir / entry["files"]["tokens"]
            )
        elif not already:
            check_dense_step(table, version_dir / entry["files"]["next"])
        steps_report.append(
            {
                "step": table.step,
                "format": table.format,
                "rows": table.rows,
                "nnz": table.nnz,
                "max_slots": table.max_slots,
                "bytes": table.nbytes,
            }
        )
    leaves = manifest["leaves"]
    if not already:
        # A v2 bundle without an offsets file has identity offsets by construction (count == items,
        # checked with the manifest); checking them again here costs nothing and keeps one code path.
        offsets_path = leaf_map_path(version_dir, leaves)
        check_leaf_offsets(np.asarray(bundle.index.leaf_offsets), leaves["items"], offsets_path)
        if catalog is None and witness is None:  # else implied by equality with the catalog's unique ids
            check_unique_items(bundle.items(), version_dir / leaves["files"]["items"])
    catalog_report = None
    if catalog is not None:
        catalog_report = check_against_catalog(bundle, catalog)
    elif witness is not None:
        catalog_report = check_against_witness(bundle, witness)
    if (
        not already
        and hash_cache is not None
        and _structure_key(version_dir, manifest, hash_cache) == structure
    ):
        hash_cache.record_pass(structure)  # the files were not changed while they were checked
    kernels = check_kernel_files(version_dir, manifest)
    quality = check_quality_files(version_dir, manifest)
    listed = set(manifest["files"]) | {MANIFEST_NAME, SIGNATURE_NAME}
    unlisted = sorted(
        p.relative_to(version_dir).as_posix()
        for p in version_dir.rglob("*")
        if not p.is_dir() and p.relative_to(version_dir).as_posix() not in listed
    )
    return {
        "bundle": str(version_dir),
        "version": bundle.version,
        "ok": True,
        "files": len(manifest["files"]),
        "bytes": sum(e["bytes"] for e in manifest["files"].values()),
        "steps": steps_report,
        "leaves": bundle.index.num_leaves,
        "items": bundle.index.num_items,
        "catalog": catalog_report,
        "unlisted_files": unlisted,
        "interrupted_update": JOURNAL_NAME in unlisted,
        "kernels": kernels,
        "quality": quality,
    }


def _structure_key(version_dir: Path, manifest: dict, hash_cache: HashCache) -> tuple:
    """What the structural checks of a version read: the manifest fields that describe its step and leaf
    files, and those files' identities (HashCache.identity)."""
    fields = {k: manifest.get(k) for k in ("format", "format_version", "codebook_sizes", "steps", "leaves")}
    names = [name for entry in manifest["steps"] for name in entry["files"].values()]
    names += list(manifest["leaves"]["files"].values())
    identities = tuple(hash_cache.identity(version_dir / name) for name in names)
    return json.dumps(fields, sort_keys=True), identities


def check_kernel_files(version_dir: Path, manifest: dict) -> list[str]:
    """The compiled kernels a version lists (their sha256 is checked with every file by open_bundle): each
    named ``kernels/sm_NN/<stem>.cubin|.ptx``, a cubin a whole CUDA ELF image for that arch and a PTX file
    a PTX module targeting it (bundle/kernel_files.py). Only each file's first KERNEL_HEAD_BYTES and its
    size are read. Returns their names; the first bad one raises BundleError naming the file."""
    names = sorted(n for n in manifest["files"] if n.startswith("kernels/"))
    for name in names:
        path = version_dir / name
        match = _KERNEL_NAME.match(name)
        if match is None:
            raise BundleError(f"{path}: a kernel file must be named kernels/sm_NN/<name>.cubin or .ptx")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(KERNEL_HEAD_BYTES)
        except OSError as exc:
            raise BundleError(f"{path}: cannot read ({exc.strerror or exc})") from None
        problem = kernel_problem(head, size, match.group(2), match.group(1))
        if problem is not None:
            raise BundleError(f"{path}: {problem}")
    return names


def check_quality_files(version_dir: Path, manifest: dict) -> dict[str, str]:
    """Every listed quality record (quality/<key>.json) against the format (docs/bundle-format.md, section
    11.3), its model version belonging to its file name. Returns {model version: order}; the first bad
    file raises BundleError naming it and the rule."""
    out = {}
    for name in sorted(n for n in manifest["files"] if n.startswith(QUALITY_DIR)):
        stem = name[len(QUALITY_DIR) :]
        if "/" in stem or not stem.endswith(".json"):
            raise BundleError(f"{version_dir / name}: a quality record must be named quality/<key>.json")
        record = load_quality(version_dir / name, expect_key=stem[: -len(".json")])
        if quality_key(record.model_version) + ".json" != stem:  # pragma: no cover - load_quality checks it
            raise BundleError(f"{version_dir / name}: model version does not match the file name")
        out[record.model_version] = record.order
    return out


def check_sparse_step(table, indptr_path: Path, tokens_path: Path) -> None:
    """indptr: starts at 0, ends at nnz, strictly increasing (every row is a real prefix, so it has at
    least one child), largest gap = max_slots. tokens: in 0..V-1 and strictly ascending within each row.
    Both read CHECK_CHUNK entries at a time (no temporary as large as a table)."""
    indptr = np.asarray(table.indptr)
    largest = _check_offsets(indptr, table.nnz, f"nnz {table.nnz}", indptr_path, "row", "children", "indptr")
    if largest != table.max_slots:
        raise BundleError(
            f"{indptr_path}: largest row has {largest} children, manifest max_slots {table.max_slots}"
        )
    tokens = np.asarray(table.tokens)
    if tokens.size and (
        (tokens.dtype.kind == "i" and int(tokens.min()) < 0) or int(tokens.max()) >= table.codebook_size
    ):
        j = int(np.flatnonzero((tokens.astype(np.int64) < 0) | (tokens >= table.codebook_size))[0])
        raise BundleError(
            f"{tokens_path}: token {tokens[j]} at position {j} outside 0..{table.codebook_size - 1}"
        )
    for a in range(0, tokens.shape[0], CHECK_CHUNK):
        b = min(tokens.shape[0], a + CHECK_CHUNK + 1)
        not_ascending = tokens[a + 1 : b] <= tokens[a : b - 1]  # [i]: position a + 1 + i vs the one before
        # Comparisons across a row boundary (a row starts at position s, a < s < b) don't count.
        at = indptr.dtype.type  # keys of the array's own type: no converted copy of it
        starts = indptr[
            np.searchsorted(indptr, at(a), side="right") : np.searchsorted(indptr, at(b - 1), side="right")
        ]
        not_ascending[starts.astype(np.int64) - a - 1] = False
        if not_ascending.any():
            j = a + 1 + int(np.flatnonzero(not_ascending)[0])
            row = int(np.searchsorted(indptr, j, side="right") - 1)
            raise BundleError(f"{tokens_path}: tokens of row {row} not strictly ascending at position {j}")


def check_dense_step(table, next_path: Path) -> None:
    """next: values -1 or a next row; every row has a child; the valid entries read in row-major order
    are exactly 0, 1, ..., nnz-1 (the row numbering rule: next rows are the flattened children)."""
    nxt = np.asarray(table.next)
    valid = nxt >= 0
    if (nxt < -1).any():
        r, v = np.argwhere(nxt < -1)[0]
        raise BundleError(f"{next_path}: next[{r}, {v}] = {nxt[r, v]} (only -1 or a row id allowed)")
    empty = ~valid.any(axis=1)
    if empty.any():
        raise BundleError(f"{next_path}: row {int(np.flatnonzero(empty)[0])} has no valid child")
    values = nxt[valid]  # boolean indexing reads in row-major order
    if values.size != table.nnz:
        raise BundleError(f"{next_path}: {values.size} valid entries, manifest nnz {table.nnz}")
    wrong = values != np.arange(table.nnz, dtype=values.dtype)
    if wrong.any():
        k = int(np.flatnonzero(wrong)[0])
        r, v = np.argwhere(valid)[k]
        raise BundleError(f"{next_path}: next[{r}, {v}] = {values[k]}, the row numbering rule requires {k}")


def leaf_map_path(version_dir: Path, leaves: dict) -> Path:
    """The file that messages about the leaf map name: the offsets file, or (v2, one item per leaf, no
    offsets stored) the manifest whose leaves count/items define it."""
    name = leaves["files"].get("offsets")
    return version_dir / (name if name is not None else MANIFEST_NAME)


def check_leaf_offsets(offsets: np.ndarray, n_items: int, path: Path) -> None:
    """leaf_offsets: 0 first, n_items last, strictly increasing (every leaf has at least one item)."""
    _check_offsets(offsets, n_items, f"{n_items} items", path, "leaf", "items", "offsets")


def _check_offsets(
    offsets: np.ndarray, end: int, end_text: str, path: Path, part: str, members: str, array: str
) -> int:
    """CSR offsets [k+1]: 0 first, `end` last, strictly increasing (no empty `part`), CHECK_CHUNK at a
    time. Returns the largest size (0 when k = 0)."""
    if offsets[0] != 0 or offsets[-1] != end:
        raise BundleError(f"{path}: must start at 0 and end at {end_text}, got {offsets[0]}..{offsets[-1]}")
    largest = 0
    for lo in range(0, offsets.shape[0] - 1, CHECK_CHUNK):
        sizes = np.diff(offsets[lo : lo + CHECK_CHUNK + 1].astype(np.int64))
        if (sizes < 1).any():
            k = int(np.flatnonzero(sizes < 1)[0])
            raise BundleError(
                f"{path}: {part} {lo + k} has {sizes[k]} {members} ({array} must strictly increase)"
            )
        largest = max(largest, int(sizes.max()))
    return largest


def check_unique_items(items, path: Path) -> None:
    """No item id twice (the catalog reader's duplicate check, so both name the first repeat alike)."""
    from ..catalog.ids import first_duplicate_row, first_row_with_id

    dup = first_duplicate_row(items)
    if dup >= 0:
        raise BundleError(
            f"{path}: item id {items[dup].as_py()!r} at position {dup} repeats position "
            f"{first_row_with_id(items, dup)}"
        )


def _key_field_bits(codebook_sizes) -> list[int]:
    """Bits of each step's field in a packed SID key (at least 1, so V = 1 still takes a field)."""
    return [bits_for(int(v)) for v in codebook_sizes]


def sid_sort_keys(sids: np.ndarray, codebook_sizes) -> np.ndarray:
    """One sortable key per SID row whose order is the lexicographic SID order.

    uint64 [N] with token t in its own bit field (most significant first) when the fields fit in 64 bits;
    otherwise void [N] of big-endian uint64 tokens, which NumPy compares bytewise, i.e. lexicographically.
    Tokens must already be within their codebooks.
    """
    bits = _key_field_bits(codebook_sizes)
    if sum(bits) <= 64:
        keys = np.zeros(sids.shape[0], dtype=np.uint64)
        for t, width in enumerate(bits):
            keys <<= np.uint64(width)
            keys |= sids[:, t].astype(np.uint64)
        return keys
    wide = np.ascontiguousarray(sids.astype(">u8"))
    return wide.view(f"V{8 * sids.shape[1]}").reshape(-1)


def leaf_sort_keys(index, codebook_sizes) -> np.ndarray:
    """sid_sort_keys of the leaves' SIDs (leaf order), straight from the tables.

    When the keys fit in uint64 they are built step by step without materialising [n_leaves, L]: the
    children of step t in flat order are the rows of step t+1 (row numbering rule, already verified), so
    key(row of t+1) = key(parent row) << bits_t | token, with parents read in ascending order.
    """
    bits = _key_field_bits(codebook_sizes)
    if sum(bits) > 64:
        return sid_sort_keys(index.leaf_sids(), codebook_sizes)
    keys = np.zeros(1, dtype=np.uint64)
    for table, width in zip(index.steps, bits, strict=True):
        if table.format == "dense":
            parent, token = np.nonzero(np.asarray(table.next) >= 0)  # row-major = flat child order
        else:
            parent, token = table.child_parents(), np.asarray(table.tokens)
        keys = (keys[parent] << np.uint64(width)) | token.astype(np.uint64)
    return keys


def _sorted_member(keys: np.ndarray, sorted_pool: np.ndarray) -> np.ndarray:
    """bool [len(keys)]: each key occurs in the ascending array `sorted_pool`."""
    if sorted_pool.shape[0] == 0:
        return np.zeros(keys.shape[0], dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_pool, keys), sorted_pool.shape[0] - 1)
    return sorted_pool[pos] == keys


def check_against_witness(bundle: Bundle, witness: BuildWitness) -> dict:
    """check_against_catalog for the catalog a build's witness holds (bundle/witness.py): through the
    witness when it holds, else in full (a mismatch raises its BundleError; a wrong witness of a right
    version passes)."""
    return witness_report(bundle, witness) or check_against_catalog(bundle, witness.as_catalog())


def check_against_catalog(bundle: Bundle, catalog: Any) -> dict:
    """Exact equality with the catalog: the bundle's leaves are exactly the catalog's distinct SIDs, and
    each leaf's items are exactly the catalog items with that SID (order within a leaf: catalog order,
    checked as sets when the order differs).

    Both sides are compared in sorted order, so every pass is sequential: sort the catalog rows by SID
    (stable, so equal SIDs keep catalog order), mark where a new SID starts; the distinct SIDs in that
    order must equal the leaves' SIDs rebuilt from the tables (leaf j = j-th distinct SID), the run
    lengths must equal the leaf item counts, and the sorted catalog item ids must equal items.parquet.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    manifest, vdir = bundle.manifest, bundle.path
    leaves_files = manifest["leaves"]["files"]
    offsets_path, items_path = leaf_map_path(vdir, bundle.manifest["leaves"]), vdir / leaves_files["items"]
    last_step_file = vdir / next(iter(manifest["steps"][-1]["files"].values()))
    sizes = bundle.index.codebook_sizes
    sids = np.asarray(catalog.sids)
    item_ids = catalog.item_ids
    if isinstance(item_ids, pa.ChunkedArray):
        item_ids = item_ids.combine_chunks()
    if sids.ndim != 2 or sids.shape[1] != bundle.index.num_steps or len(item_ids) != sids.shape[0]:
        raise BundleError(
            f"{vdir / MANIFEST_NAME}: {bundle.index.num_steps} steps, catalog SIDs have shape {sids.shape} "
            f"and {len(item_ids)} item ids"
        )
    catalog_sizes = tuple(getattr(catalog, "codebook_sizes", None) or ())
    if catalog_sizes and not getattr(catalog, "codebook_inferred", False) and catalog_sizes != sizes:
        raise BundleError(
            f"{vdir / MANIFEST_NAME}: codebook_sizes {list(sizes)}, catalog {list(catalog_sizes)}"
        )
    for t, size in enumerate(sizes):
        column = sids[:, t]
        if column.size and (int(column.min()) < 0 or int(column.max()) >= size):
            i = int(np.flatnonzero((column < 0) | (column >= size))[0])
            raise BundleError(
                f"{vdir / MANIFEST_NAME}: catalog row {i} (item {item_ids[i].as_py()!r}) token "
                f"{int(column[i])} at step {t} is outside the bundle's codebook 0..{size - 1}"
            )

    catalog_keys = sid_sort_keys(sids, sizes)
    if catalog_keys.dtype == np.uint64:  # linear-time radix sort, the same order as a stable argsort
        bits = sum(_key_field_bits(sizes))
        order, sorted_keys = stable_argsort_keys(catalog_keys, bits, overwrite=True)
    else:
        order = np.argsort(catalog_keys, kind="stable")
        sorted_keys = catalog_keys[order]
    del catalog_keys
    starts = np.ones(sorted_keys.shape[0], dtype=bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    distinct = sorted_keys[starts]
    del sorted_keys
    leaf_keys = leaf_sort_keys(bundle.index, sizes)
    common = min(distinct.shape[0], leaf_keys.shape[0])
    differ = np.flatnonzero(distinct[:common] != leaf_keys[:common])
    if differ.size or distinct.shape[0] != leaf_keys.shape[0]:
        # Name a catalog SID the bundle lacks if there is one, else a leaf the catalog lacks.
        missing = np.flatnonzero(~_sorted_member(distinct, leaf_keys))
        if missing.size:
            i = int(order[np.flatnonzero(starts)[missing[0]]])
            raise BundleError(
                f"{last_step_file}: catalog row {i} (item {item_ids[i].as_py()!r}) SID {sids[i].tolist()} "
                "is not in the bundle"
            )
        k = int(np.flatnonzero(~_sorted_member(leaf_keys, distinct))[0])
        n_items = int(bundle.index.leaf_offsets[k + 1] - bundle.index.leaf_offsets[k])
        raise BundleError(
            f"{offsets_path}: leaf {k} (SID {bundle.index.leaf_sids()[k].tolist()}) has {n_items} items, "
            "the catalog 0 (SID not in the catalog)"
        )
    del distinct, leaf_keys
    offsets = np.asarray(bundle.index.leaf_offsets)
    run_starts = np.flatnonzero(starts)
    counts = np.diff(np.append(run_starts, starts.shape[0]))
    differ = np.flatnonzero(counts != np.diff(offsets))
    if differ.size:
        j = int(differ[0])
        raise BundleError(
            f"{offsets_path}: leaf {j} has {np.diff(offsets)[j]} items, the catalog {counts[j]}"
        )
    items = bundle.items()
    if items.type != item_ids.type:
        raise BundleError(f"{items_path}: item_id type {items.type}, catalog {item_ids.type}")
    expected = item_ids.take(pa.array(order))
    in_order = expected.equals(items)
    if not in_order:
        leaf_sorted = pa.array(np.cumsum(starts) - 1)
        got = pa.table({"leaf": leaf_sorted, "id": items}).sort_by(
            [("leaf", "ascending"), ("id", "ascending")]
        )
        want = pa.table({"leaf": leaf_sorted, "id": expected}).sort_by(
            [("leaf", "ascending"), ("id", "ascending")]
        )
        if not got.column("id").equals(want.column("id")):
            unequal = pc.not_equal(got.column("id"), want.column("id"))
            k = int(np.flatnonzero(unequal.to_numpy(zero_copy_only=False))[0])
            raise BundleError(
                f"{items_path}: leaf {got.column('leaf')[k].as_py()} "
                f"holds item {got.column('id')[k].as_py()!r}, "
                f"the catalog maps {want.column('id')[k].as_py()!r} there"
            )
    return {
        "rows": int(sids.shape[0]),
        "distinct_sids": bundle.index.num_leaves,
        "matched": True,
        "item_order_matches": bool(in_order),
    }
