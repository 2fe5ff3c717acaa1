"""Item embeddings -> semantic IDs by residual k-means, plus a collision-resolving last token.

Pure numpy: arrays in, arrays out, seeded. The recipe follows TIGER's RQ idea without training an
autoencoder: level l clusters the residual left after subtracting the centroids chosen at levels < l,
so items that share a prefix are close in embedding space. A final token numbers the items that still
share all L levels (0, 1, 2, ... in item order), which makes every SID unique.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zerogr_build.base.errors import InputError


def interaction_embeddings(
    sequences: Sequence[np.ndarray],
    n_items: int,
    dim: int = 32,
    *,
    side_features: np.ndarray | None = None,
    side_weight: float = 1.0,
) -> np.ndarray:
    """Item embeddings float32 [n_items, D]: user x item matrix SVD, plus optional side features.

    sequences: per user, item indices int in 0..n_items-1 (only training events, so no test leakage).
    side_features: float [n_items, F] (e.g. genre one-hots), row-normalised and appended with side_weight.
    Each block is L2-normalised per item, so neither dominates by scale.
    """
    n_users = len(sequences)
    mat = np.zeros((n_users, n_items), dtype=np.float64)
    for u, seq in enumerate(sequences):
        mat[u, np.asarray(seq, dtype=np.int64)] = 1.0
    # Column-normalise (popular items otherwise fill the first components), then SVD of the item side.
    mat /= np.sqrt(np.maximum(mat.sum(axis=0, keepdims=True), 1.0))
    k = max(1, min(dim, min(mat.shape) - 1))
    _, s, vt = np.linalg.svd(mat, full_matrices=False)
    emb = (vt[:k].T * s[:k]).astype(np.float64)
    blocks = [_row_normalise(emb)]
    if side_features is not None:
        side = np.asarray(side_features, dtype=np.float64)
        if side.shape[0] != n_items:
            raise InputError(f"side_features has {side.shape[0]} rows, expected {n_items}")
        blocks.append(side_weight * _row_normalise(side))
    return np.concatenate(blocks, axis=1).astype(np.float32)


def genre_features(genres: Sequence[Sequence[str]]) -> np.ndarray:
    """Multi-hot float32 [I, G] of genre names (G = distinct names, sorted)."""
    names = sorted({g for gs in genres for g in gs})
    col = {g: j for j, g in enumerate(names)}
    out = np.zeros((len(genres), len(names)), dtype=np.float32)
    for i, gs in enumerate(genres):
        for g in gs:
            out[i, col[g]] = 1.0
    return out


def _row_normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def kmeans(x: np.ndarray, k: int, *, iters: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means, k-means++ seeding. x float [N, D] -> (centroids float64 [k', D], labels int64 [N]).

    k' = min(k, N). Empty clusters are re-seeded with the point farthest from its centroid, so every
    returned centroid has at least one member. Deterministic for a given seed.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    k = min(int(k), n)
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, x.shape[1]), dtype=np.float64)
    centroids[0] = x[rng.integers(n)]
    d2 = ((x - centroids[0]) ** 2).sum(axis=1)
    for c in range(1, k):
        total = d2.sum()
        idx = int(rng.choice(n, p=d2 / total)) if total > 0 else int(rng.integers(n))
        centroids[c] = x[idx]
        d2 = np.minimum(d2, ((x - centroids[c]) ** 2).sum(axis=1))
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(iters):
        dist = _sq_dists(x, centroids)
        new = dist.argmin(axis=1)
        counts = np.bincount(new, minlength=k)
        # k <= n, so while a cluster is empty another holds >= 2 points: move the point farthest from its
        # centroid among those, which never empties its old cluster.
        for c in np.flatnonzero(counts == 0):
            own = dist[np.arange(n), new]
            own[counts[new] < 2] = -1.0
            far = int(own.argmax())
            counts[new[far]] -= 1
            new[far] = c
            counts[c] += 1
        if np.array_equal(new, labels):
            break
        labels = new
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, x)
        centroids = sums / np.bincount(labels, minlength=k)[:, None]
    return centroids, labels


def _sq_dists(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances float64 [N, K] (expanded form; clipped at 0 against rounding)."""
    d = (x * x).sum(axis=1)[:, None] - 2.0 * x @ c.T + (c * c).sum(axis=1)[None, :]
    return np.maximum(d, 0.0)


def residual_kmeans(
    x: np.ndarray, codebook_sizes: Sequence[int], *, iters: int = 50, seed: int = 0
) -> np.ndarray:
    """Residual quantisation codes int64 [N, L] for embeddings x [N, D], level l with codebook_sizes[l].

    Level l runs k-means on the residual x - sum_{j<l} centroid_j(item) (seed + l), so level 0 captures the
    coarse structure and later levels refine it.
    """
    residual = np.asarray(x, dtype=np.float64).copy()
    codes = np.empty((residual.shape[0], len(codebook_sizes)), dtype=np.int64)
    for level, size in enumerate(codebook_sizes):
        centroids, labels = kmeans(residual, int(size), iters=iters, seed=seed + level)
        codes[:, level] = labels
        residual -= centroids[labels]
    return codes


def add_collision_token(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Append a last token that numbers items sharing the same code (0, 1, ... in row order).

    codes int [N, L] -> (sids int64 [N, L+1], all rows distinct; last codebook size = max(1, largest group)).
    """
    codes = np.asarray(codes, dtype=np.int64)
    n = codes.shape[0]
    # Stable lexicographic sort groups equal codes with rows in ascending order; the rank inside each
    # group is then position - group start.
    order = np.lexsort(codes.T[::-1])
    sorted_codes = codes[order]
    new_group = np.ones(n, dtype=bool)
    if n > 1:
        new_group[1:] = (sorted_codes[1:] != sorted_codes[:-1]).any(axis=1)
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - group_start
    last_size = int(rank.max()) + 1 if n else 1
    return np.concatenate([codes, rank[:, None]], axis=1), last_size


def semantic_ids(
    x: np.ndarray, codebook_sizes: Sequence[int], *, iters: int = 50, seed: int = 0
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Unique SIDs int64 [N, L+1] and their codebook sizes (codebook_sizes + the collision codebook)."""
    codes = residual_kmeans(x, codebook_sizes, iters=iters, seed=seed)
    sids, last = add_collision_token(codes)
    return sids, tuple(int(v) for v in codebook_sizes) + (last,)
