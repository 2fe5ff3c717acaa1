"""Synthetic SID catalogs that look like real residual-quantisation (RQ) codes, written as Parquet.

Why a generative model and not uniform noise: real RQ catalogs are skewed and hierarchical. A few coarse
codes (first tokens) hold a large share of the items, the children of a popular prefix concentrate on a few
tokens, how concentrated they are differs from parent to parent, and near-duplicate items share a whole SID.
Index sizes, slot counts (max children per row) and decoding cost all depend on those tails, so benchmarks
on uniform codes would flatter everything.

The skewed process ("skewed" mode), step by step, for every item independently:

* step 0: rank r ~ truncated power law over 0..V_0-1 with exponent `skew[0]` (Zipf-like popularity of
  coarse codes); token = perm_0[r] for a fixed random permutation perm_0.
* step t >= 1: the item's parent is its length-t prefix. Each parent gets, from a hash of the prefix (so
  every item with that prefix agrees, without any grouping pass), its own exponent
  skew[t] * exp(spread * (2h - 1)), h uniform in [0, 1) (parent-dependent fan-out: some parents spread
  their items over many children, some pile them on a few), and its own rotation of the token order. The
  item's rank is drawn from the parent's truncated power law; token = (perm_t[rank] + rotation) mod V_t.

Collisions (several items with one SID) arise on their own where a parent's last-step law is steep. The
"uniform" mode draws every token independently and uniformly (a best case for everything, for contrast).

Everything is vectorised numpy over all items at once (a few passes per step), so 20M rows take seconds.

Writing one: `zerogr demo-catalog OUT.parquet -n N -V 8192,8192,8192` (the CLI over this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .catalog import unsigned_dtype_for

MODES = ("skewed", "uniform")
ITEM_ID_TYPES = ("int64", "string")
SID_TYPES = ("auto", "uint16", "int32", "int64")

# Default power-law exponents: coarse codes Zipf(~1); middle steps spread out (RQ residual codebooks are
# used far more evenly than the first one); last step steeper, so leaves of hot prefixes collide.
DEFAULT_FIRST_SKEW = 0.7
DEFAULT_MIDDLE_SKEW = 0.35
DEFAULT_LAST_SKEW = 0.9
DEFAULT_SPREAD = 1.3

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def default_skew(num_steps: int) -> tuple[float, ...]:
    """Per-step power-law exponents used by the skewed mode for SIDs of `num_steps` tokens."""
    if num_steps == 1:
        return (DEFAULT_FIRST_SKEW,)
    return (DEFAULT_FIRST_SKEW,) + (DEFAULT_MIDDLE_SKEW,) * (num_steps - 2) + (DEFAULT_LAST_SKEW,)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 [n] (wrapping arithmetic): a cheap, well-spread hash of a prefix."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _power_law_ranks(u: np.ndarray, exponent: np.ndarray | float, size: int) -> np.ndarray:
    """Ranks 0..size-1 from a continuous power law x^-exponent on [1, size+1), by inverse CDF.

    u float64 [n] uniform in [0, 1); exponent a scalar or float64 [n] (per item). Returns int64 [n].
    With a = 1 - exponent the CDF is (x^a - 1) / ((size+1)^a - 1); solving for x in log space with
    log1p/expm1 stays exact as a -> 0 (the exponent-1 case, whose CDF is log x / log(size+1)).
    """
    a = 1.0 - np.asarray(exponent, dtype=np.float64)
    log_top = np.log(size + 1.0)
    near_one = np.abs(a) < 1e-9
    safe_a = np.where(near_one, 1.0, a)
    log_x = np.where(near_one, u * log_top, np.log1p(u * np.expm1(safe_a * log_top)) / safe_a)
    ranks = np.exp(log_x).astype(np.int64) - 1
    return np.clip(ranks, 0, size - 1, out=ranks)


def generate_sids(
    n: int,
    codebook_sizes: Sequence[int],
    seed: int = 0,
    mode: str = "skewed",
    *,
    skew: Sequence[float] | None = None,
    spread: float = DEFAULT_SPREAD,
) -> np.ndarray:
    """Draw n SIDs, one per item, in random (catalog) order.

    codebook_sizes: V_t per step (its length is L). mode: "skewed" (see module docstring) or "uniform".
    skew: per-step power-law exponents (default `default_skew(L)`); spread: how far a parent's exponent
    strays from its step's, as a log-scale half-width. Deterministic for a given (n, sizes, seed, mode,
    skew, spread). Returns [n, L] in the smallest unsigned dtype that fits (uint16 for V <= 65536).
    """
    sizes = [int(v) for v in codebook_sizes]
    if n < 0 or not sizes or min(sizes) < 1:
        raise ValueError(f"need n >= 0 and codebook sizes >= 1, got n={n}, sizes={sizes}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    num_steps = len(sizes)
    rng = np.random.default_rng(seed)
    out = np.empty((n, num_steps), dtype=unsigned_dtype_for(max(sizes) - 1))
    if mode == "uniform":
        for t, size in enumerate(sizes):
            out[:, t] = rng.integers(0, size, size=n)
        return out
    exponents = tuple(float(s) for s in (skew if skew is not None else default_skew(num_steps)))
    if len(exponents) != num_steps:
        raise ValueError(f"skew needs {num_steps} exponents, got {len(exponents)}")
    prefix_hash = np.full(n, np.uint64(rng.integers(0, 2**63)), dtype=np.uint64)
    for t, size in enumerate(sizes):
        perm = rng.permutation(size).astype(np.int64)
        u = rng.random(n)
        if t == 0:
            ranks = _power_law_ranks(u, exponents[0], size)
            tokens = perm[ranks]
        else:
            # Per-parent law, derived from the prefix hash so all items of one parent share it.
            h01 = (prefix_hash >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
            parent_exponent = exponents[t] * np.exp(spread * (2.0 * h01 - 1.0))
            ranks = _power_law_ranks(u, parent_exponent, size)
            del h01, parent_exponent
            rotation = (prefix_hash % np.uint64(size)).astype(np.int64)
            tokens = perm[ranks]
            tokens += rotation
            tokens %= size
            del rotation
        out[:, t] = tokens
        if t + 1 < num_steps:
            prefix_hash = _mix64(prefix_hash * _GOLDEN + tokens.astype(np.uint64) + np.uint64(t + 1))
    return out


def children_stats(sids: np.ndarray) -> list[dict[str, float]]:
    """Children per row at every step (the per-step index's fan-out), from raw SIDs [N, L].

    Returns one dict per step t: rows (distinct length-t prefixes), nnz (distinct length-(t+1) prefixes),
    max / mean / p99 children per row; plus, under key "leaves"/"collided_items" on the last dict, the
    number of distinct SIDs and of items sharing their SID with another item.
    """
    n, num_steps = sids.shape
    order = np.lexsort(sids.T[::-1])
    s = sids[order]
    diff = s[1:] != s[:-1]
    # Sorted rows: row i+1 starts a new length-k prefix exactly when its first differing column is < k.
    first_diff = np.where(diff.any(axis=1), diff.argmax(axis=1), num_steps)
    del diff, s
    stats = []
    parent_new = np.ones(1, dtype=bool)  # step 0: one parent (the empty prefix), starting at row 0
    parent_start = np.zeros(1, dtype=np.int64)
    for t in range(num_steps):
        child_new = np.empty(n, dtype=bool)
        child_new[0] = True
        child_new[1:] = first_diff <= t
        child_rank = np.cumsum(child_new)  # 1-based rank of the distinct child prefix at each row
        nnz = int(child_rank[-1])
        starts = np.append(child_rank[parent_start] - 1, nnz)
        counts = np.diff(starts)
        stats.append(
            {
                "step": t,
                "rows": int(counts.size),
                "nnz": nnz,
                "max": int(counts.max()),
                "mean": float(counts.mean()),
                "p99": float(np.percentile(counts, 99)),
            }
        )
        parent_new = child_new
        parent_start = np.flatnonzero(parent_new)
    leaf_sizes = np.diff(np.append(parent_start, n))
    stats[-1]["leaves"] = int(leaf_sizes.size)
    stats[-1]["collided_items"] = int(leaf_sizes[leaf_sizes > 1].sum())
    stats[-1]["max_items_per_leaf"] = int(leaf_sizes.max())
    return stats


def make_item_ids(n: int, kind: str = "int64", seed: int = 0) -> pa.Array:
    """Unique item ids [n] as a pyarrow Array: int64 (scattered, non-contiguous) or string ("item-<id>")."""
    if kind not in ITEM_ID_TYPES:
        raise ValueError(f"item id type must be one of {ITEM_ID_TYPES}, got {kind!r}")
    rng = np.random.default_rng([seed, 1])
    # An odd multiplier is invertible modulo 2^63, so i -> (i * mult + offset) mod 2^63 never repeats.
    mult = np.uint64(int(rng.integers(1, 2**62)) * 2 + 1)
    offset = np.uint64(int(rng.integers(0, 2**62)))
    ids = ((np.arange(n, dtype=np.uint64) * mult + offset) & np.uint64(2**63 - 1)).astype(np.int64)
    array = pa.array(ids, type=pa.int64())
    if kind == "int64":
        return array
    return pc.binary_join_element_wise("item-", pc.cast(array, pa.string()), "")


def catalog_table(
    sids: np.ndarray, item_ids: pa.Array, *, sid_type: str = "auto", fixed_size_list: bool = False
) -> pa.Table:
    """pyarrow Table with columns item_id and sid (list or fixed-size list of sid_type) from SIDs [N, L]."""
    if sid_type not in SID_TYPES:
        raise ValueError(f"sid type must be one of {SID_TYPES}, got {sid_type!r}")
    n, num_steps = sids.shape
    top = int(sids.max()) if sids.size else 0
    if sid_type == "auto":
        sid_type = "uint16" if top <= 65535 else "int32"
    if top > np.iinfo(np.dtype(sid_type)).max:  # the cast below would wrap tokens around silently
        raise ValueError(f"token {top} does not fit sid type {sid_type}")
    flat = pa.array(np.ascontiguousarray(sids, dtype=np.dtype(sid_type)).reshape(-1))
    if fixed_size_list:
        column = pa.FixedSizeListArray.from_arrays(flat, num_steps)
    else:
        offsets = pa.array(np.arange(0, (n + 1) * num_steps, num_steps, dtype=np.int32))
        column = pa.ListArray.from_arrays(offsets, flat)
    return pa.table({"item_id": item_ids, "sid": column})


def write_catalog(
    path: str | Path,
    n: int,
    codebook_sizes: Sequence[int],
    *,
    seed: int = 0,
    mode: str = "skewed",
    item_id_type: str = "int64",
    row_group_size: int = 1_000_000,
    sid_type: str = "auto",
    fixed_size_list: bool = False,
    compression: str = "snappy",
) -> np.ndarray:
    """Generate a catalog and write it as one Parquet file; returns the SIDs [N, L] that were written."""
    sids = generate_sids(n, codebook_sizes, seed, mode)
    table = catalog_table(
        sids, make_item_ids(n, item_id_type, seed), sid_type=sid_type, fixed_size_list=fixed_size_list
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size, compression=compression)
    return sids
