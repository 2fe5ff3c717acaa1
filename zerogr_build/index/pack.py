"""Sort keys packed as the catalog is read: per item, its first token (the counting sort's bucket) and one
64-bit word holding tokens 1.. (most significant first) above the catalog row number.

A build that packs each batch as it arrives never holds the [N, L] token array: 2-4 + 8 bytes per item
instead of L x (1-8) bytes plus the words the sort makes from them anyway. `index.sort.layout_from_packed`
sorts these words; `index.build.build_index_packed` turns them into step tables.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ..base.memory import fresh_zeros, populate_rows, populated_zeros
from .formats import bits_for

#: Test-only: a smaller one-word limit (bits), so the tests can build catalogs "past the key width" with
#: a few thousand items. Unset (the default) is the real limit, 64.
WORD_BITS_ENV = "ZEROGR_TEST_WORD_BITS"


def word_bits() -> int:
    """Bits one packed key may use: 64, or less when the tests lower it (WORD_BITS_ENV)."""
    return min(64, int(os.environ.get(WORD_BITS_ENV) or 64))


def packable(num_items: int, codebook_sizes: Sequence[int], limit: int | None = None) -> bool:
    """Whether tokens 1.. and a row number of 0..num_items-1 fit one 64-bit word (limit: the bits allowed,
    default word_bits())."""
    bits = sum(bits_for(int(v)) for v in codebook_sizes[1:]) + bits_for(num_items)
    return bits <= (word_bits() if limit is None else limit)


def first_token_dtype(codebook_size: int) -> np.dtype:
    """uint16 while the first codebook fits it, else uint32 (codebooks are at most 2^31)."""
    return np.dtype(np.uint16) if codebook_size <= 65536 else np.dtype(np.uint32)


@dataclass(eq=False)
class PackedSids:
    """The SIDs of N items as sort keys, rows in catalog order.

    first   uint16|uint32 [N]: token 0 of each SID.
    words   uint64 [N]: token t (t >= 1) at bits [shifts[t], shifts[t] + bits_for(V_t)), the row number in
            the low `row_bits` bits.
    codebook_sizes  V_t, t = 0..L-1.
    """

    first: np.ndarray
    words: np.ndarray
    codebook_sizes: tuple[int, ...]

    @property
    def num_items(self) -> int:
        return int(self.words.shape[0])

    @property
    def num_steps(self) -> int:
        return len(self.codebook_sizes)

    @property
    def row_bits(self) -> int:
        return bits_for(self.num_items)

    @property
    def shifts(self) -> np.ndarray:
        return word_shifts(self.codebook_sizes, self.num_items)

    @classmethod
    def empty(cls, num_items: int, codebook_sizes: Sequence[int]) -> PackedSids:
        """Zeroed outputs for `num_items` rows, filled batch by batch with `pack_into`, which maps each
        batch's pages in bulk first (_memory.populate_rows) so the batches never fault."""
        sizes = tuple(int(v) for v in codebook_sizes)
        first = fresh_zeros(num_items, first_token_dtype(sizes[0]))
        return cls(first, fresh_zeros(num_items, np.uint64), sizes)

    def pack_into(self, tokens: np.ndarray, row: int) -> None:
        """Pack validated tokens int [n, L] (any integer dtype, values in range) as rows row..row+n-1."""
        if tokens.shape[0]:
            populate_rows(self.first, row, row + tokens.shape[0])
            populate_rows(self.words, row, row + tokens.shape[0])
            _pack_block(tokens, row, self.shifts, self.first, self.words)

    def release(self) -> tuple[np.ndarray, np.ndarray]:
        """(first, words), leaving this object holding empty arrays: the sort takes the words over so they
        are freed as soon as it has moved them, even while a Catalog still refers to this object."""
        first, words = self.first, self.words
        self.first, self.words = first[:0].copy(), words[:0].copy()
        return first, words

    def unpack(self) -> np.ndarray:
        """int64 [N, L]: the tokens back (for tests and small tools)."""
        out = np.empty((self.num_items, self.num_steps), dtype=np.int64)
        out[:, 0] = self.first
        shifts = self.shifts
        for t in range(1, self.num_steps):
            mask = np.uint64((1 << bits_for(self.codebook_sizes[t])) - 1)
            out[:, t] = (self.words >> np.uint64(shifts[t])) & mask
        return out


def word_shifts(codebook_sizes: Sequence[int], num_items: int) -> np.ndarray:
    """int64 [L]: where token t (t >= 1) starts in a packed word (row bits lowest); shifts[0] unused (0)."""
    shifts = np.zeros(len(codebook_sizes), dtype=np.int64)
    acc = bits_for(num_items)
    for t in range(len(codebook_sizes) - 1, 0, -1):
        shifts[t] = acc
        acc += bits_for(int(codebook_sizes[t]))
    return shifts


def pack_sids(sids: np.ndarray, codebook_sizes: Sequence[int]) -> PackedSids:
    """PackedSids of a whole validated [N, L] array (the in-memory build's path)."""
    packed = PackedSids.empty(sids.shape[0], codebook_sizes)
    packed.pack_into(np.ascontiguousarray(sids), 0)
    return packed


@njit(cache=True, nogil=True)
def _pack_block(tokens, row0, shifts, first, words):
    num_steps = tokens.shape[1]
    for i in range(tokens.shape[0]):
        word = np.uint64(row0 + i)
        for t in range(1, num_steps):
            word |= np.uint64(tokens[i, t]) << np.uint64(shifts[t])
        first[row0 + i] = tokens[i, 0]
        words[row0 + i] = word


def pack_by_first_token(
    sids: np.ndarray, shifts: np.ndarray, segments: np.ndarray, seg_offsets: np.ndarray
) -> np.ndarray:
    """uint64 [N]: the packed words of validated sids int [N, L] (tokens 1.. and the row, as PackedSids
    packs them) already in a stable counting-sort order by first token: packing and the counting sort's
    scatter in one pass, with no PackedSids in between (the in-memory build's path).

    segments int64 [S+1]: contiguous row ranges scattered in parallel; seg_offsets int64 [S, B]: where
    segment s writes its first word of bucket b (bucket b = first token b). The destination's pages are
    mapped in bulk first (populated_zeros), so the scattered writes never fault."""
    words = populated_zeros(sids.shape[0], np.uint64)
    cursor = np.ascontiguousarray(seg_offsets, dtype=np.int64).copy()
    _pack_scatter(sids, segments, shifts, cursor, words)
    return words


@njit(cache=True, parallel=True)
def _pack_scatter(tokens, segments, shifts, cursor, words):
    num_steps = tokens.shape[1]
    for s in prange(segments.shape[0] - 1):
        for i in range(segments[s], segments[s + 1]):
            word = np.uint64(i)
            for t in range(1, num_steps):
                word |= np.uint64(tokens[i, t]) << np.uint64(shifts[t])
            b = tokens[i, 0]
            words[cursor[s, b]] = word
            cursor[s, b] += 1
