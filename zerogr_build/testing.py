"""The APIs in this module are used for testing and debugging and are prone to change. Don't use them in
production.

Test doubles and test-only helpers of zerogr, one section per area.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .quality.data import INTER_MEMBER, ITEM_MEMBER

# --- quality and compare (H3) ---


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


def write_fake_wheel(path: str | Path, inter_text: str, item_text: str) -> Path:
    """Write a zip with the two recbole members (tests of `read_ml100k_wheel` without network)."""
    path = Path(path)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(INTER_MEMBER, inter_text)
        z.writestr(ITEM_MEMBER, item_text)
    return path
