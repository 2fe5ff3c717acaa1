"""Bundle format v2 (and v1, still read): names, dtypes and the manifest schema (see docs/bundle-format.md).

Everything a reader must check before trusting a manifest lives here, so the writer, the reader and
`verify` share one definition. No I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from ..base.errors import BundleError
from ..index.tables import leaf_map_dtype

FORMAT_NAME = "zerogr-bundle"
FORMAT_VERSION = 2
#: Versions this reader reads. v1 always stores leaves.offsets as int64; v2 stores no offsets when every
#: SID names one item (leaf j is item j), else int32 offsets when the item count fits, else int64.
READABLE_FORMAT_VERSIONS = (1, 2)

MANIFEST_NAME = "manifest.json"
LATEST_NAME = "LATEST"
LOCK_NAME = ".lock"
#: `zerogr rebuild`'s run lock: held (flock) for a whole run; holds the holder's pid, host, start and run id.
RUN_LOCK_NAME = ".rebuild.lock"
COUNTER_NAME = ".last_version"
JOURNAL_NAME = "manifest.json.journal"
#: The signature of manifest.json (docs/bundle-format.md 13.4): written by push and pull, never listed.
SIGNATURE_NAME = "manifest.json.sig"
LEAF_OFFSETS_NAME = "leaves.offsets.npy"
ITEMS_NAME = "items.parquet"
ITEM_COLUMN = "item_id"
TEMP_PREFIX = ".tmp-"
DEFAULT_OUT = "bundles"

VERSION_DIR_RE = re.compile(r"v([0-9]{6,})\Z")  # ASCII digits only; used with fullmatch
#: The highest version number (9 digits): a name past it is not a version zerogr writes, but a stray or
#: hostile object, never taken for one (a number of any length would overflow the metrics' floats, the
#: local file system's NAME_MAX, and every later number claimed after it).
MAX_VERSION = 999_999_999

# Allowed dtypes per array role (little-endian only). tokens may be uint16 only while V <= 65536.
ROLE_DTYPES: dict[str, tuple[str, ...]] = {
    "indptr": ("<i4", "<i8"),
    "tokens": ("<u2", "<i4"),
    "next": ("<i4",),
    "offsets": ("<i4", "<i8"),
}
SPARSE_ROLES = ("indptr", "tokens")
DENSE_ROLES = ("next",)


def version_dir_name(version: int) -> str:
    """Dir name of a version: v000007 for 7 (six digits, more once past 999999)."""
    return f"v{version:06d}"


def parse_version_dir(name: str) -> int | None:
    """Version number of a version dir name, or None if the name is not one (a number past MAX_VERSION
    included: see oversized_version_dir)."""
    match = VERSION_DIR_RE.fullmatch(name)
    if not match or len(match.group(1)) > len(str(MAX_VERSION)):
        return None
    return int(match.group(1))


def oversized_version_dir(name: str) -> bool:
    """True for a name shaped like a version dir whose number is past MAX_VERSION (v + 10 or more digits,
    not v0000000001): a stray or hostile object, refused by name rather than ignored as "not a version"."""
    match = VERSION_DIR_RE.fullmatch(name)
    return bool(match) and len(match.group(1).lstrip("0")) > len(str(MAX_VERSION))


def shown_version_dir(name: str) -> str:
    """A version-like name for a message: whole when short, else its head and its length."""
    return name if len(name) <= 24 else f"{name[:16]}...({len(name) - 1} digits)"


def step_file_name(step: int, role: str) -> str:
    """File name of one step array, e.g. "step0.next.npy" or "step2.tokens.npy"."""
    return f"step{step}.{role}.npy"


def dtype_str(dtype: np.dtype) -> str:
    """The little-endian dtype string stored in manifests ("<u2", "<i4", ...)."""
    return np.dtype(dtype).newbyteorder("<").str


def check_relpath(name: Any, where: str) -> str:
    """Refuse a manifest file name that could leave the version dir or is not a plain relative path.

    Allowed: "/"-separated, relative, no empty, "." or ".." component, no backslash or NUL, and not a name
    this format reserves for itself (manifest, journal, signature, temp files).
    """
    if not isinstance(name, str) or not name:
        raise BundleError(f"{where}: file name must be a non-empty string, got {name!r}")
    if "\\" in name or "\x00" in name or name.startswith("/"):
        raise BundleError(f"{where}: file name {name!r} is not a relative POSIX path")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise BundleError(f"{where}: file name {name!r} would leave the bundle dir or is not normalised")
    if name in (MANIFEST_NAME, JOURNAL_NAME, SIGNATURE_NAME) or any(p.startswith(TEMP_PREFIX) for p in parts):
        raise BundleError(f"{where}: file name {name!r} is reserved")
    return str(PurePosixPath(name))


# ---------------------------------------------------------------------------------------------- manifest


def _need(obj: Mapping, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise BundleError(f"{where}: missing field {key!r}")
    value = obj[key]
    # bool is an int subclass; no integer field of the format accepts true/false.
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BundleError(f"{where}: field {key!r} must be {_names(types)}, got {value!r}")
    if not isinstance(value, types):
        raise BundleError(f"{where}: field {key!r} must be {_names(types)}, got {type(value).__name__}")
    return value


def _names(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def _need_count(obj: Mapping, key: str, where: str, minimum: int = 0) -> int:
    value = _need(obj, key, int, where)
    if value < minimum:
        raise BundleError(f"{where}: field {key!r} must be >= {minimum}, got {value}")
    return value


def validate_manifest(manifest: Any, where: str = MANIFEST_NAME) -> dict:
    """Check every field v1/v2 define (presence, type, range, cross-field consistency). Returns it.

    Raises BundleError naming `where` (the manifest file) and the field. Unknown extra fields are allowed
    (later writers of the same version may add fields; see docs/bundle-format.md, "Compatibility").
    """
    if not isinstance(manifest, dict):
        raise BundleError(f"{where}: top level must be a JSON object")
    fmt = _need(manifest, "format", str, where)
    if fmt != FORMAT_NAME:
        raise BundleError(f"{where}: format is {fmt!r}, expected {FORMAT_NAME!r}")
    format_version = _need(manifest, "format_version", int, where)
    if format_version not in READABLE_FORMAT_VERSIONS:
        newer = " (written by a newer zerogr; upgrade to read it)" if format_version > FORMAT_VERSION else ""
        readable = " and ".join(map(str, READABLE_FORMAT_VERSIONS))
        raise BundleError(
            f"{where}: format_version {format_version} is not supported (this reader reads {readable}){newer}"
        )
    if _need_count(manifest, "version", where, minimum=1) > MAX_VERSION:
        raise BundleError(f"{where}: field 'version' is past {MAX_VERSION}")
    _need(manifest, "created_at", str, where)
    _need(manifest, "model_version", (str, type(None)), where)
    catalog = _need(manifest, "catalog", dict, where)
    for key in ("path", "fingerprint"):
        _need(catalog, key, (str, type(None)), f"{where}: catalog")
    _need_count(catalog, "rows", f"{where}: catalog", minimum=1)
    _need_count(catalog, "distinct_sids", f"{where}: catalog", minimum=1)
    _need(manifest, "settings", dict, where)
    _validate_run_fields(manifest, where)

    num_steps = _need_count(manifest, "num_steps", where, minimum=1)
    sizes = _need(manifest, "codebook_sizes", list, where)
    if len(sizes) != num_steps or not all(type(v) is int and 1 <= v < 2**31 for v in sizes):
        raise BundleError(f"{where}: codebook_sizes must be {num_steps} integers in 1..2^31-1, got {sizes}")

    files = _need(manifest, "files", dict, where)
    for name, entry in files.items():
        check_relpath(name, f"{where}: files")
        entry_where = f"{where}: files[{name!r}]"
        if not isinstance(entry, dict):
            raise BundleError(f"{entry_where} must be an object")
        _need_count(entry, "bytes", entry_where)
        digest = _need(entry, "sha256", str, entry_where)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise BundleError(f"{entry_where}: sha256 must be 64 lowercase hex digits")

    steps = _need(manifest, "steps", list, where)
    if len(steps) != num_steps:
        raise BundleError(f"{where}: {len(steps)} steps listed, num_steps is {num_steps}")
    expected_rows = 1
    for t, entry in enumerate(steps):
        _validate_step(entry, t, sizes[t], expected_rows, files, where)
        expected_rows = entry["nnz"]

    leaves = _need(manifest, "leaves", dict, where)
    leaves_where = f"{where}: leaves"
    count = _need_count(leaves, "count", leaves_where, minimum=1)
    items = _need_count(leaves, "items", leaves_where, minimum=1)
    if count != expected_rows:
        raise BundleError(f"{leaves_where}: count {count} != nnz of the last step ({expected_rows})")
    if items < count:
        raise BundleError(f"{leaves_where}: items {items} < leaf count {count} (every leaf has an item)")
    if count != catalog["distinct_sids"] or items != catalog["rows"]:
        raise BundleError(f"{where}: catalog rows/distinct_sids disagree with leaves items/count")
    _validate_leaf_map(leaves, format_version, count, items, files, leaves_where)
    return manifest


def _validate_run_fields(manifest: Mapping, where: str) -> None:
    """The optional fields rebuild and the guards write: `rebuild_run` (the run id of the `zerogr rebuild`
    that built the version), `guards` (what each guard measured against LATEST: a list of {guard, value,
    threshold, bound, fired, note}), `changes` (the item counts of that comparison: against, items_added,
    items_removed, items_sid_changed, items_common, sids_comparable, model_tag_changed) and `accept_change`
    (the --accept-change that let fired guards through: reason, guards, against, at)."""
    if "rebuild_run" in manifest:
        _need(manifest, "rebuild_run", str, where)
    if "guards" in manifest:
        for i, check in enumerate(_need(manifest, "guards", list, where)):
            check_where = f"{where}: guards[{i}]"
            if not isinstance(check, dict):
                raise BundleError(f"{check_where} must be an object")
            for key, types in (("guard", str), ("value", (int, float)), ("threshold", (int, float)),
                               ("bound", str), ("fired", bool), ("note", str)):  # fmt: skip
                _need(check, key, types, check_where)
    if "changes" in manifest:
        changes = _need(manifest, "changes", dict, where)
        changes_where = f"{where}: changes"
        _need(changes, "against", str, changes_where)
        for key in ("items_added", "items_removed", "items_sid_changed", "items_common"):
            count = _need(changes, key, int, changes_where)
            if isinstance(count, bool) or count < 0:
                raise BundleError(f"{changes_where}: {key} must be a count >= 0, got {count!r}")
        for key in ("sids_comparable", "model_tag_changed"):
            _need(changes, key, bool, changes_where)
    if "accept_change" in manifest:
        accepted = _need(manifest, "accept_change", dict, where)
        accepted_where = f"{where}: accept_change"
        _need(accepted, "reason", str, accepted_where)
        guards = _need(accepted, "guards", list, accepted_where)
        if not all(isinstance(g, str) for g in guards):
            raise BundleError(f"{accepted_where}: guards must be a list of strings")
        _need(accepted, "against", (str, type(None)), accepted_where)
        _need(accepted, "at", str, accepted_where)


def _validate_leaf_map(
    leaves: Mapping, format_version: int, count: int, items: int, files: Mapping, where: str
) -> None:
    """The leaf map's files and offsets dtype. v1: files {offsets, items}, dtype absent or '<i8'.
    v2: exactly the layout a v2 writer chooses (index.tables.leaf_map_dtype): no offsets file and dtype
    null when count == items, else files {offsets, items} with dtype '<i4' (items < 2^31) or '<i8'."""
    leaf_files = _need(leaves, "files", dict, where)
    if format_version == 1:
        roles, dtype = {"offsets", "items"}, leaves.get("dtype", "<i8")
        if dtype != "<i8":
            raise BundleError(f"{where}: offsets dtype must be '<i8', got {dtype!r}")
    else:
        if "dtype" not in leaves:
            raise BundleError(f"{where}: missing field 'dtype'")
        dtype, expected = leaves["dtype"], leaf_map_dtype(count, items)
        if dtype != expected:
            raise BundleError(
                f"{where}: offsets dtype must be {expected!r} for {count} leaves and {items} items, "
                f"got {dtype!r}"
            )
        roles = {"items"} if dtype is None else {"offsets", "items"}
    if set(leaf_files) != roles:
        raise BundleError(f"{where}: files must name exactly {' and '.join(repr(r) for r in sorted(roles))}")
    for role, name in leaf_files.items():
        check_relpath(name, f"{where}: files.{role}")
        if name not in files:
            raise BundleError(f"{where}: file {name!r} is not listed in files")


def _validate_step(entry: Any, t: int, size: int, rows_expected: int, files: Mapping, where: str) -> None:
    step_where = f"{where}: steps[{t}]"
    if not isinstance(entry, dict):
        raise BundleError(f"{step_where} must be an object")
    if _need(entry, "step", int, step_where) != t:
        raise BundleError(f"{step_where}: step must be {t}, got {entry['step']}")
    fmt = _need(entry, "format", str, step_where)
    if fmt not in ("sparse", "dense"):
        raise BundleError(f"{step_where}: format must be 'sparse' or 'dense', got {fmt!r}")
    rows = _need_count(entry, "rows", step_where, minimum=1)
    nnz = _need_count(entry, "nnz", step_where, minimum=1)
    max_slots = _need_count(entry, "max_slots", step_where, minimum=1)
    if rows != rows_expected:
        what = "1 (step 0 is the empty prefix)" if t == 0 else f"nnz of step {t - 1} ({rows_expected})"
        raise BundleError(f"{step_where}: rows {rows} must equal {what}")
    if nnz < rows or nnz > rows * size:
        raise BundleError(f"{step_where}: nnz {nnz} outside rows..rows*V ({rows}..{rows * size})")
    if "codebook_size" in entry and entry["codebook_size"] != size:
        raise BundleError(f"{step_where}: codebook_size {entry['codebook_size']} != codebook_sizes[{t}]")
    if fmt == "dense" and max_slots != size:
        raise BundleError(f"{step_where}: a dense step has max_slots = V ({size}), got {max_slots}")
    if fmt == "sparse" and max_slots > min(size, nnz):
        raise BundleError(f"{step_where}: max_slots {max_slots} exceeds min(V, nnz)")
    _need(entry, "valid_share", (int, float), step_where)
    _need_count(entry, "bytes", step_where)
    roles = SPARSE_ROLES if fmt == "sparse" else DENSE_ROLES
    step_files = _need(entry, "files", dict, step_where)
    dtypes = _need(entry, "dtypes", dict, step_where)
    if set(step_files) != set(roles) or set(dtypes) != set(roles):
        raise BundleError(f"{step_where}: a {fmt} step has files and dtypes for exactly {list(roles)}")
    for role in roles:
        name = check_relpath(step_files[role], f"{step_where}: files.{role}")
        if name not in files:
            raise BundleError(f"{step_where}: file {name!r} is not listed in files")
        if dtypes[role] not in ROLE_DTYPES[role]:
            raise BundleError(
                f"{step_where}: dtype {dtypes[role]!r} of {role} not allowed ({', '.join(ROLE_DTYPES[role])})"
            )
    if fmt == "sparse":
        if dtypes["tokens"] == "<u2" and size > 65536:
            raise BundleError(f"{step_where}: uint16 tokens cannot hold codebook size {size}")
        if dtypes["indptr"] == "<i4" and nnz >= 2**31:
            raise BundleError(f"{step_where}: int32 indptr cannot hold nnz {nnz}")


def manifest_bytes(manifest: Mapping) -> bytes:
    """manifest.json's bytes as writers write them (also the journal's): indented JSON, newline-ended."""
    return (json.dumps(manifest, indent=1, default=str) + "\n").encode()


def array_specs(manifest: Mapping) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{file name: (dtype str, shape)} of every array of a validated manifest: what the .npy headers
    must say exactly."""
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    sizes = manifest["codebook_sizes"]
    for entry in manifest["steps"]:
        files, dtypes, rows, nnz = entry["files"], entry["dtypes"], entry["rows"], entry["nnz"]
        if entry["format"] == "dense":
            specs[files["next"]] = (dtypes["next"], (rows, sizes[entry["step"]]))
        else:
            specs[files["indptr"]] = (dtypes["indptr"], (rows + 1,))
            specs[files["tokens"]] = (dtypes["tokens"], (nnz,))
    leaves = manifest["leaves"]
    if "offsets" in leaves["files"]:
        specs[leaves["files"]["offsets"]] = (leaves.get("dtype", "<i8"), (leaves["count"] + 1,))
    return specs
