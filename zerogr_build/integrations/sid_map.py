"""How a model spells SIDs in its vocabulary: code c of step t is one token id (numpy only, no torch).

    sid_map = SidMap.from_offsets([o_0, ..., o_{L-1}], eos_token_id=None)   # token = o_t + c (TIGER)
    sid_map = SidMap.from_table({token: (step, code), ...})                 # any explicit spelling
    tokens = sid_map.token_table(codebook_sizes)   # L arrays int64 [V_t]: token of each code, -1 = none

Offsets may overlap (one shared code vocabulary for every step): a token is only ever read at a known
step, so only (step, code) -> token must be one-to-one within a step. `eos_token_id`, when given, is the
token forced after the last step and must not spell any code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass(frozen=True, eq=False)
class SidMap:
    """Code -> token spelling of SIDs in a model vocabulary. Build with from_offsets or from_table.

    offsets: per-step first token (token = offsets[t] + code), or None when `table` is given.
    table: int64 [n, 3] rows (token, step, code), or None when `offsets` is given.
    eos_token_id: token forced after step L-1 (HF generate then needs max_new_tokens = L + 1), or None.
    """

    offsets: tuple[int, ...] | None
    table: np.ndarray | None
    eos_token_id: int | None = None

    @classmethod
    def from_offsets(cls, offsets: Sequence[int], eos_token_id: int | None = None) -> SidMap:
        """token = offsets[t] + code; one offset per step (L of them)."""
        values = tuple(_non_negative_int(o, "offset") for o in offsets)
        if not values:
            raise InputError("SidMap.from_offsets needs one offset per step, got none")
        return cls(offsets=values, table=None, eos_token_id=_optional_token(eos_token_id))

    @classmethod
    def from_table(
        cls, table: Mapping[int, tuple[int, int]] | np.ndarray | Sequence[Sequence[int]], eos_token_id=None
    ) -> SidMap:
        """An explicit token -> (step, code) table: {token: (step, code)} or rows (token, step, code).

        Rows may repeat a token at different steps (a shared code vocabulary), never a (step, code) pair
        nor a (token, step) pair. Steps are 0..L-1, every step must appear.
        """
        if isinstance(table, Mapping):
            rows = [(tok, *_pair(value)) for tok, value in table.items()]
        else:
            rows = [tuple(r) for r in np.asarray(table).tolist()]
        if not rows or any(len(r) != 3 for r in rows):
            raise InputError("SidMap.from_table needs rows of (token, step, code), at least one")
        arr = np.array([[_non_negative_int(v, "table entry") for v in r] for r in rows], dtype=np.int64)
        steps = np.unique(arr[:, 1])
        if not np.array_equal(steps, np.arange(steps.shape[0])):
            raise InputError(f"SidMap table steps must be 0..L-1 with none missing, got {steps.tolist()}")
        for cols, what in (([1, 2], "(step, code)"), ([0, 1], "(token, step)")):
            pairs, counts = np.unique(arr[:, cols], axis=0, return_counts=True)
            if (counts > 1).any():
                raise InputError(f"SidMap table repeats the {what} pair {pairs[counts > 1][0].tolist()}")
        return cls(offsets=None, table=arr, eos_token_id=_optional_token(eos_token_id))

    @property
    def num_steps(self) -> int:
        return len(self.offsets) if self.offsets is not None else int(self.table[:, 1].max()) + 1

    def token_table(self, codebook_sizes: Sequence[int]) -> tuple[np.ndarray, ...]:
        """L arrays int64 [V_t]: the token of each code of step t, -1 where the map spells none."""
        sizes = [int(v) for v in codebook_sizes]
        if len(sizes) != self.num_steps:
            raise InputError(f"SidMap has {self.num_steps} steps, the index has {len(sizes)}")
        if self.offsets is not None:
            out = tuple(np.arange(o, o + v, dtype=np.int64) for o, v in zip(self.offsets, sizes, strict=True))
        else:
            tok, step, code = self.table.T
            if (code >= np.asarray(sizes)[step]).any():
                bad = int(np.flatnonzero(code >= np.asarray(sizes)[step])[0])
                raise InputError(
                    f"SidMap table spells code {int(code[bad])} at step {int(step[bad])}, "
                    f"beyond its codebook size {sizes[int(step[bad])]}"
                )
            out = tuple(np.full(v, -1, dtype=np.int64) for v in sizes)
            for t, line in enumerate(out):
                line[code[step == t]] = tok[step == t]
        if self.eos_token_id is not None:
            for t, line in enumerate(out):
                if (line == self.eos_token_id).any():
                    raise InputError(f"eos_token_id {self.eos_token_id} also spells a code of step {t}")
        return out

    def to_codes(self, tokens: np.ndarray, codebook_sizes: Sequence[int]) -> np.ndarray:
        """int64 [..., L]: the codes spelled by tokens int [..., L] (-1 where a token spells no code)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        table = self.token_table(codebook_sizes)
        if tokens.shape[-1] != len(table):
            raise InputError(f"to_codes needs [..., {len(table)}] tokens, got {tokens.shape}")
        out = np.empty(tokens.shape, dtype=np.int64)
        for t, line in enumerate(table):
            known = np.flatnonzero(line >= 0)
            inverse = np.full(int(line.max(initial=-1)) + 2, -1, dtype=np.int64)  # last slot: not a code
            inverse[line[known]] = known
            col = tokens[..., t]
            out[..., t] = inverse[np.where((col >= 0) & (col < inverse.size - 1), col, inverse.size - 1)]
        return out


def catalog_token_table(sid_map: SidMap, index) -> tuple[np.ndarray, ...]:
    """sid_map.token_table for a SidIndex, checked to spell every code its catalog uses."""
    table = sid_map.token_table(index.codebook_sizes)
    for t, (step, line) in enumerate(zip(index.steps, table, strict=True)):
        if step.next is not None:
            used = np.flatnonzero((np.asarray(step.next) >= 0).any(axis=0))
        else:
            used = np.unique(np.asarray(step.tokens))
        missing = used[line[used] < 0]
        if missing.size:
            raise InputError(f"the catalog uses code {int(missing[0])} at step {t}; the SidMap spells none")
    return table


def _pair(value) -> tuple[int, int]:
    step, code = value
    return step, code


def _non_negative_int(value, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 0:
        raise InputError(f"SidMap {what} must be a non-negative integer, got {value!r}")
    return int(value)


def _optional_token(value) -> int | None:
    return None if value is None else _non_negative_int(value, "eos_token_id")


__all__ = ["SidMap", "catalog_token_table"]
