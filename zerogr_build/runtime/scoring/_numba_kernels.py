"""numba kernel of the CPU selective-scoring mode (compiled on first use, cached on disk).

One kernel, `score_slots`, specialised by numba on the *raw* element type of the weight rows, which names
the weight's format (the wrapper in selective_numba.py passes the tensor's bits, never a converted copy):

    float32  fp32 weights, read as they are
    uint16   bf16 weights as their 16-bit patterns: the fp32 value is the pattern shifted into the high half
    int16    fp16 weights as their 16-bit patterns: widened exactly to fp32 by bit arithmetic (numba has no
             float16 type on CPU)

Every conversion is exact, so the only difference from the torch reference is the summation order of the
fp32 dot products (the kernel lets LLVM reassociate them into SIMD lanes and fuse multiply-adds).
"""

from __future__ import annotations

import llvmlite.ir as llvm_ir
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload

#: Reassociation (SIMD partial sums) and FMA contraction for the dot products. Deliberately not "fast":
#: the log-softmax relies on -inf and NaN behaving as IEEE says.
_FASTMATH = {"reassoc", "contract"}

_HALF_SHIFTED_EXP = np.uint32(0x7C00 << 13)  # fp16 exponent mask, moved to where fp32 keeps it
_HALF_EXP_ADJUST = np.uint32((127 - 15) << 23)  # fp16 -> fp32 exponent bias
_HALF_INF_ADJUST = np.uint32((128 - 16) << 23)  # Inf/NaN: exponent all ones in fp32 too
_HALF_DENORMAL_ADJUST = np.uint32(1 << 23)
_HALF_MAGIC = np.float32(2.0**-14)  # the fp32 whose bits are 113 << 23: renormalises fp16 denormals


@intrinsic
def _bits_to_f32(typingctx, bits):
    """float32 whose bits are the low 32 bits of an unsigned integer (a bitcast, no conversion).

    Any unsigned width is accepted because numba widens uint32 arithmetic to uint64."""
    if not isinstance(bits, types.Integer) or bits.signed or bits.bitwidth < 32:
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, llvm_ir.IntType(32))
        return builder.bitcast(value, llvm_ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _f32_to_bits(typingctx, value):
    """float32 -> uint32 with the same 32 bits."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(32))

    return types.uint32(types.float32), codegen


@njit(cache=True)
def half_bits_to_f32(bits: np.int16) -> np.float32:
    """The fp32 value of an fp16 bit pattern, exact for every pattern (normals, denormals, +-0, Inf, NaN).

    Move exponent and mantissa into fp32's fields and rebias the exponent; Inf/NaN get the all-ones fp32
    exponent; a denormal gets exponent 1 and the magic value (2**-14) subtracted, which renormalises it.
    """
    half = np.uint32(np.uint16(bits))
    out = (half & np.uint32(0x7FFF)) << np.uint32(13)
    exponent = out & _HALF_SHIFTED_EXP
    out += _HALF_EXP_ADJUST
    if exponent == _HALF_SHIFTED_EXP:
        out += _HALF_INF_ADJUST
    elif exponent == 0:
        out += _HALF_DENORMAL_ADJUST
        out = _f32_to_bits(_bits_to_f32(out) - _HALF_MAGIC)
    return _bits_to_f32(out | ((half & np.uint32(0x8000)) << np.uint32(16)))


def widen(raw):
    """fp32 value of one raw weight element (float32 / bf16 bits as uint16 / fp16 bits as int16)."""
    raise NotImplementedError("widen is compiled by numba only")


@overload(widen)
def _widen_impl(raw):
    if raw == types.float32:
        return lambda raw: raw
    if raw == types.uint16:
        return lambda raw: _bits_to_f32(np.uint32(raw) << np.uint32(16))
    if raw == types.int16:
        return lambda raw: half_bits_to_f32(raw)
    return None


@njit(cache=True)
def _plus(a: np.float32, b: np.float32) -> np.float32:
    """a + b as IEEE says: a function of its own, compiled without the kernel's fast-math flags (numba
    inlining would give it them), so the add is exactly torch's fp32 add."""
    return a + b


@njit(cache=True, parallel=True, fastmath=_FASTMATH)
def score_slots(
    hidden: np.ndarray,
    weight: np.ndarray,
    row_stride: int,
    bias: np.ndarray,
    slot_tokens: np.ndarray,
    vocab: int,
    log_softmax: bool,
    beam_scores: np.ndarray,
    out: np.ndarray,
) -> None:
    """Write each slot's score (or each row's log-softmax over its valid slots) into `out`, in place.

    Args:
        hidden: beams' hidden vectors, float32. Shape: (R, d), C-contiguous.
        weight: the weight matrix's elements from row 0 on, raw (see module docstring); row v starts at
            v * row_stride. Shape: ((V - 1) * row_stride + d,).
        row_stride: elements between consecutive weight rows (d for a contiguous weight).
        bias: raw bias elements, the weight's element type; empty = no bias. Shape: (V,) or (0,).
        slot_tokens: token of every slot; tokens outside [0, vocab) mark empty slots. Shape: (R, K), int32.
        vocab: V, the number of weight rows.
        log_softmax: False: out[r, k] = hidden[r] . weight[tok] + bias[tok]; True: those scores
            log-softmaxed over row r's valid slots.
        beam_scores: float32, added to every slot of row r last (beam_scores[r] + out[r, k], the fp32 add
            torch's `beam_scores[:, None] + out` makes); empty = nothing added. Shape: (R,) or (0,).
        out: float32, -inf at empty slots (a row without valid slots is all -inf, never NaN).
            Shape: (R, K).

    Parallel over beams (rows of slot_tokens); each slot's weight row is read in place and only valid
    slots are computed, so the work is proportional to the number of valid slots, not to R * K.
    """
    rows, slots = slot_tokens.shape
    dim = hidden.shape[1]
    has_bias = bias.shape[0] > 0
    has_scores = beam_scores.shape[0] > 0
    neg_inf = np.float32(-np.inf)
    for r in prange(rows):
        h = hidden[r]
        best = neg_inf
        for k in range(slots):
            token = slot_tokens[r, k]
            if token < 0 or token >= vocab:
                out[r, k] = neg_inf
                continue
            # A slice per row: indexing weight[base + j] directly makes numba check every index for
            # wrap-around (base could be negative as far as it knows), which blocks SIMD (3.5x slower).
            base = np.int64(token) * row_stride
            w = weight[base : base + dim]
            acc = np.float32(0.0)
            for j in range(dim):
                acc += h[j] * widen(w[j])
            if has_bias:
                acc += widen(bias[token])
            out[r, k] = acc
            if acc > best:
                best = acc
        if log_softmax and best > neg_inf:
            # logsumexp over the valid slots (empty ones are -inf: exp gives 0). A non-finite total
            # (an infinite or NaN score) subtracts nothing, as selective_torch.masked_log_softmax does.
            total = np.float32(0.0)
            for k in range(slots):
                if out[r, k] > neg_inf:  # exp(-inf) is 0: empty slots only cost the compare
                    total += np.exp(out[r, k] - best)
            lse = best + np.log(total)
            if np.isfinite(lse):
                for k in range(slots):
                    out[r, k] -= lse
        if has_scores:
            score = beam_scores[r]
            for k in range(slots):
                out[r, k] = _plus(score, out[r, k])


#: A candidate's rank within its request: (its beam's index in the request) * SLOT_SPAN + its slot.
SLOT_SPAN = np.int64(1) << np.int64(32)


@njit(cache=True, inline="always")
def _better(value_a, rank_a, value_b, rank_b):
    """Candidate a goes before candidate b: the larger total (NaN above every number, as torch.topk
    orders them), then the smaller rank."""
    if value_a != value_a:
        return value_b == value_b or rank_a < rank_b
    if value_b != value_b:
        return False
    if value_a != value_b:
        return value_a > value_b
    return rank_a < rank_b


@njit(cache=True, inline="always")
def _sift_down(values, ranks, size, node):
    # Min-heap on _better: the root is the worst candidate held.
    while True:
        child = 2 * node + 1
        if child >= size:
            return
        if child + 1 < size and _better(values[child], ranks[child], values[child + 1], ranks[child + 1]):
            child += 1
        if not _better(values[node], ranks[node], values[child], ranks[child]):
            return
        values[node], values[child] = values[child], values[node]
        ranks[node], ranks[child] = ranks[child], ranks[node]
        node = child


@njit(cache=True, parallel=True, fastmath=_FASTMATH)
def select_slots(
    hidden: np.ndarray,
    weight: np.ndarray,
    row_stride: int,
    bias: np.ndarray,
    tokens: np.ndarray,
    first: np.ndarray,
    used: np.ndarray,
    vocab: int,
    beam_scores: np.ndarray,
    slot_words: np.ndarray,
    request_words: np.ndarray,
    kills: np.ndarray,
    kill_from: np.ndarray,
    kill_stride: int,
    out_values: np.ndarray,
    out_beam: np.ndarray,
    out_slot: np.ndarray,
) -> None:
    """A filter-first step's best M candidates per request, without an [R, K] array of totals: each beam's
    slots scored and log-softmaxed over its valid slots exactly as score_slots does (log_softmax=True, the
    beam's score added last), and each request's candidates kept in a heap of M. Slots may also be
    emptied here by a request's item constraints (include sets, exclusions), read where the slots lie.

    Args:
        hidden, weight, row_stride, bias, vocab: as score_slots.
        tokens: int32, the slots' tokens end to end (tokens outside [0, vocab) are empty slots).
        first, used: int64 [R]: beam r's slots are tokens[first[r] : first[r] + used[r]] (its slot k is
            tokens[first[r] + k]; slots past used[r] would be empty).
        beam_scores: float32 [R].
        slot_words, request_words: slot p of `tokens` is also empty when (slot_words[p] &
            request_words[b]) == 0, b its beam's request (one signed integer word per slot / request;
            slot_words empty: no such test).
        kills, kill_from, kill_stride: int64 ascending [k], slot p of beam r (request b) is also empty
            when b * kill_stride + p is in `kills`; beam r's first candidate is kills[kill_from[r]] (int64
            [R], the first kill >= b * kill_stride + first[r]); kills empty: none.
        out_values: float32 [B, M], written: request b's best totals, best first (R = B * beams per
            request, in request order); -inf past its last candidate.
        out_beam: int64 [B, M], written: the beam (0..R-1) of each; request b's first beam past its last.
        out_slot: int64 [B, M], written: the slot of each; 0 past the last.

    Order: larger totals first (NaN first, as torch.topk), equal totals by beam, then slot. Parallel over
    requests; the work is the valid slots, not R * K.
    """
    num_requests, m = out_values.shape
    per = first.shape[0] // num_requests
    dim = hidden.shape[1]
    has_bias = bias.shape[0] > 0
    neg_inf = np.float32(-np.inf)
    with_words = slot_words.shape[0] > 0
    num_kills = kills.shape[0]
    width = 0
    for r in range(used.shape[0]):
        width = max(width, used[r])
    for b in prange(num_requests):
        totals = np.empty(width, dtype=np.float32)
        valid = np.empty(width, dtype=np.bool_)
        heap_values = np.empty(m, dtype=np.float32)
        heap_ranks = np.empty(m, dtype=np.int64)
        size = 0
        word = request_words[b] if with_words else 0
        for i in range(per):
            r = b * per + i
            at = first[r]
            row = tokens[at : at + used[r]]
            slots = row.shape[0]
            h = hidden[r]
            best = neg_inf
            key = b * kill_stride + at  # kills[j] - key: the slot that kill j empties
            kill = kill_from[r] if num_kills else 0
            next_kill = kills[kill] - key if kill < num_kills else np.int64(slots)
            for k in range(slots):
                token = row[k]
                empty = token < 0 or token >= vocab
                if with_words and not empty:
                    empty = (slot_words[at + k] & word) == 0
                if k == next_kill:
                    empty = True
                    while kill < num_kills and kills[kill] - key <= k:
                        kill += 1
                    next_kill = kills[kill] - key if kill < num_kills else np.int64(slots)
                valid[k] = not empty
                if empty:
                    totals[k] = neg_inf
                    continue
                base = np.int64(token) * row_stride
                w = weight[base : base + dim]
                acc = np.float32(0.0)
                for j in range(dim):
                    acc += h[j] * widen(w[j])
                if has_bias:
                    acc += widen(bias[token])
                totals[k] = acc
                if acc > best:
                    best = acc
            if best > neg_inf:
                total = np.float32(0.0)
                for k in range(slots):
                    if totals[k] > neg_inf:
                        total += np.exp(totals[k] - best)
                lse = best + np.log(total)
                if np.isfinite(lse):
                    for k in range(slots):
                        totals[k] -= lse
            score = beam_scores[r]
            for k in range(slots):
                if not valid[k]:
                    continue  # an empty slot: a -inf candidate, like the padding past the last one
                value = _plus(score, totals[k])
                rank = np.int64(i) * SLOT_SPAN + k
                if size < m:
                    node = size
                    heap_values[node], heap_ranks[node] = value, rank
                    size += 1
                    while node > 0:
                        parent = (node - 1) // 2
                        if not _better(heap_values[parent], heap_ranks[parent], heap_values[node],
                                       heap_ranks[node]):  # fmt: skip
                            break
                        heap_values[node], heap_values[parent] = heap_values[parent], heap_values[node]
                        heap_ranks[node], heap_ranks[parent] = heap_ranks[parent], heap_ranks[node]
                        node = parent
                elif _better(value, rank, heap_values[0], heap_ranks[0]):
                    heap_values[0], heap_ranks[0] = value, rank
                    _sift_down(heap_values, heap_ranks, size, 0)
        for idx in range(m - 1, size - 1, -1):
            out_values[b, idx] = neg_inf
            out_beam[b, idx] = b * per
            out_slot[b, idx] = 0
        for idx in range(size - 1, -1, -1):  # the worst held goes last
            rank = heap_ranks[0]
            out_values[b, idx] = heap_values[0]
            out_beam[b, idx] = b * per + rank // SLOT_SPAN
            out_slot[b, idx] = rank % SLOT_SPAN
            heap_values[0], heap_ranks[0] = heap_values[idx], heap_ranks[idx]
            _sift_down(heap_values, heap_ranks, idx, 0)
