"""numba kernels of an availability swap (space.make_resident) and of the exclusion counts (kills.py) over the
mask's rank structure (space.AvailabilityRank: the mask as bits, one uint64 word per 64 items, and the
available items before each word), compiled on first use and cached on disk; space.py imports this module on
the first swap, so numba is not loaded before.

The available items of a leaf-ordered run [lo, hi) are rank(hi) - rank(lo), with rank(x) = before[x >> 6]
plus the set bits of word x >> 6 below bit x & 63: two lookups in structures of items / 8 bytes (1.25 MB
at 10M items, cache-resident), where a prefix sum of the mask is 4 bytes per item written on every swap.
A sparse step table's children are masked in one serial pass over the mask's bits and the bits where each
child's item run starts (ItemSpace.starts, items / 8 bytes per step), reading each token and writing it or
-1: per child 8 bytes of memory traffic, where a pass over the int64 item bounds and a prefix sum of the
mask read and wrote several times that (the swap is bound by memory bandwidth).
"""

from __future__ import annotations

import llvmlite.ir as llvm_ir
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

_ONE = np.uint64(1)


@intrinsic
def _ctpop(typingctx, value):
    """The number of set bits of a uint64 (LLVM's ctpop: one popcnt instruction where the CPU has it)."""
    if value != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.ctpop", [llvm_ir.IntType(64)])
        return builder.call(fn, [args[0]])

    return types.uint64(types.uint64), codegen


@njit(cache=True, nogil=True, inline="always")
def ones(v: np.uint64) -> np.int64:
    """The number of set bits of v (uint64)."""
    return np.int64(_ctpop(v))


@njit(cache=True, nogil=True, inline="always")
def rank(words: np.ndarray, before: np.ndarray, x: np.int64) -> np.int64:
    """The available items among positions 0 .. x-1 (0 <= x <= items)."""
    w = x >> 6
    below = (_ONE << np.uint64(x & 63)) - _ONE
    return before[w] + ones(words[w] & below)


@njit(cache=True, nogil=True)
def masked_children(starts: np.ndarray, words: np.ndarray, tokens: np.ndarray, out: np.ndarray) -> None:
    """out[j] = tokens[j] where child row j has an available item, else -1 (tokens / out int32 [rows]).

    starts: uint64 [items // 64 + 1], bit p set where a row's item run begins (ItemSpace.starts): row j
    runs from the j-th set bit to the next one (or the last item), since every row holds an item. One
    pass over both bit arrays, 64 items a word: a word's availability bits below the next start belong to
    the current row, the rest to the rows that start in it."""
    j = -1
    seen = np.uint64(0)  # the current row's available bits so far
    for w in range(starts.shape[0]):
        s = starts[w]
        a = words[w]
        while s:
            low = s & (~s + _ONE)  # the next start in this word
            below = low - _ONE
            if j >= 0:
                seen |= a & below
                out[j] = tokens[j] | np.int32(np.int64(seen != 0) - 1)  # the token, or -1: no branch
            j += 1
            a &= ~below
            seen = np.uint64(0)
            s &= s - _ONE
        seen |= a
    if j >= 0:
        out[j] = tokens[j] | np.int32(np.int64(seen != 0) - 1)


@njit(cache=True, nogil=True)
def valid_rows(starts: np.ndarray, words: np.ndarray, out: np.ndarray) -> None:
    """out[j] (bool [rows]) = row j has an available item (starts as in masked_children)."""
    j = -1
    seen = np.uint64(0)
    for w in range(starts.shape[0]):
        s = starts[w]
        a = words[w]
        while s:
            low = s & (~s + _ONE)
            below = low - _ONE
            if j >= 0:
                out[j] = (seen | (a & below)) != 0
            j += 1
            a &= ~below
            seen = np.uint64(0)
            s &= s - _ONE
        seen |= a
    if j >= 0:
        out[j] = seen != 0


@njit(cache=True, nogil=True)
def count_rows(words: np.ndarray, before: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """int64 [k]: the available items of each run lo[i] .. hi[i] - 1 (int64 [k] each)."""
    out = np.empty(lo.shape[0], dtype=np.int64)
    for i in range(lo.shape[0]):
        out[i] = rank(words, before, hi[i]) - rank(words, before, lo[i])
    return out
