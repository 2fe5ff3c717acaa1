"""A dense step table ([rows, V] next rows) from its sparse form, with no per-child temporaries."""

from __future__ import annotations

import numpy as np
from numba import njit


def dense_next(indptr: np.ndarray, tokens: np.ndarray, rows: int, codebook_size: int) -> np.ndarray:
    """int32 [rows, codebook_size]: next[r, v] = j for the j-th flat child (row r, token v), else -1.

    indptr int [rows+1] and tokens int [nnz]: the step in CSR form (children of row r are
    tokens[indptr[r]:indptr[r+1]]). Written row by row in place: no int64 parents, token or child-number
    arrays of nnz entries (3 x 8 B per child at the build's peak, were they made with numpy)."""
    nxt = np.full((rows, codebook_size), -1, dtype=np.int32)
    _fill_dense(indptr, tokens, nxt)
    return nxt


@njit(cache=True, nogil=True)
def _fill_dense(indptr, tokens, nxt):
    for r in range(nxt.shape[0]):
        for j in range(indptr[r], indptr[r + 1]):
            nxt[r, tokens[j]] = j
