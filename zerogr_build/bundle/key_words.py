"""Packed SID keys (diff_math.KeyLayout) as the diff's numba kernels read them: uint64 [n, W] words, or
uint64 [n] when the layout has one word (`kernel_keys`). The helpers compile for either dimension (numba
picks the implementation by the array's type), so a kernel is written once and a one-word layout runs
without a loop over words: that loop inside a kernel's hot loop made the leaf merge and the key
expansion about five times slower with W = 1 (measured), the common case (a SID of up to 64 bits).

numba's on-disk cache keys a kernel on its own file only: after editing this one, clear the __pycache__
of the modules whose kernels call it (leaf_merge, diff_math), or they keep the old code.
"""

from __future__ import annotations

import numpy as np
from numba.extending import overload


def kernel_keys(keys: np.ndarray) -> np.ndarray:
    """keys uint64 [n, W] (C order) as a kernel should take them: the [n] view of its one column when
    W = 1, else the array itself."""
    return keys.reshape(-1) if keys.ndim == 2 and keys.shape[1] == 1 else keys


def key_rows(keys: np.ndarray, words: int) -> np.ndarray:
    """kernel_keys' inverse: uint64 [n, words] (a view of a one-word kernel's [n] output)."""
    return keys.reshape(-1, words) if keys.ndim == 1 else keys


def compare_keys(a: np.ndarray, i: int, b: np.ndarray, j: int) -> int:
    """-1, 0 or 1: key a[i] against key b[j], word by word (lexicographic SID order)."""
    x, y = np.atleast_1d(a[i]), np.atleast_1d(b[j])
    for u, v in zip(x.tolist(), y.tolist(), strict=True):
        if u != v:
            return -1 if u < v else 1
    return 0


def copy_key(out: np.ndarray, i: int, keys: np.ndarray, k: int) -> None:
    """out[i] = keys[k] (every word)."""
    out[i] = keys[k]


def child_key(out: np.ndarray, i: int, parent: np.ndarray, k: int, radix, word: int, token) -> None:
    """out[i] = parent[k] with word `word` = parent's word * radix + token (a child's key)."""
    if out.ndim == 1:
        out[i] = parent[k] * radix + token
    else:
        out[i] = parent[k]
        out[i, word] = parent[k, word] * radix + token


@overload(compare_keys)
def _compare_keys(a, i, b, j):
    if a.ndim == 1:

        def one_word(a, i, b, j):
            x, y = a[i], b[j]
            return -1 if x < y else (1 if x > y else 0)

        return one_word

    def words(a, i, b, j):
        for w in range(a.shape[1]):
            if a[i, w] != b[j, w]:
                return -1 if a[i, w] < b[j, w] else 1
        return 0

    return words


@overload(copy_key)
def _copy_key(out, i, keys, k):
    if out.ndim == 1:

        def one_word(out, i, keys, k):
            out[i] = keys[k]

        return one_word

    def words(out, i, keys, k):
        for w in range(out.shape[1]):
            out[i, w] = keys[k, w]

    return words


@overload(child_key)
def _child_key(out, i, parent, k, radix, word, token):
    if out.ndim == 1:

        def one_word(out, i, parent, k, radix, word, token):
            out[i] = parent[k] * radix + np.uint64(token)

        return one_word

    def words(out, i, parent, k, radix, word, token):
        for w in range(out.shape[1]):
            out[i, w] = parent[k, w]
        out[i, word] = parent[k, word] * radix + np.uint64(token)

    return words
