"""A catalog's step tables on a torch device, applied as masks over a model's whole vocabulary.

    masks = VocabMasks(index, token_table, vocab_size, device)
    rows = masks.rows(generated)            # model tokens int64 [R, t] -> int64 [R] rows of step t
    masked = masks.apply(scores, rows, t)   # [R, vocab]: scores at valid children's tokens, -inf elsewhere

Every beam is handled at once (no Python per beam) and nothing is read back to the host, so the masks can
be built inside a CUDA stream / graph. A row is found from the generated tokens alone, by walking the
tables from the root: that is what makes it robust to any reordering of the beams between calls.

Dead beams (a prefix outside the catalog) sit on a sentinel row, one past the step's last row, and a token
that spells no code of a step reads as the sentinel code V_t: every table has one extra empty row (and
column), so dead beams need no separate mask at any stage.

Layouts per step, chosen once here:
  - walking: a flat next-row table [(rows+1) * (V_t+1)] when it fits in `table_bytes`, else a searchsorted
    over the sorted keys row * (V_t+1) + code of the step's children.
  - masking: a bool table [rows+1, V_t] (one row copy per beam) when rows * V_t fits in `table_bytes`, else
    each beam's children read from the CSR arrays into max_slots fixed slots.
The output is -inf everywhere plus the step's own columns (a slice when the step's tokens are contiguous,
as with SidMap.from_offsets), cheaper than masking the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..base.errors import InputError

TABLE_BYTES = 64 * 1024 * 1024  # largest per-step table (next rows or valid cells) built on the device


@dataclass(frozen=True)
class _Step:
    """One step on the device. Sentinels: row `rows` (dead beam), code `codebook_size` (not a code)."""

    rows: int
    codebook_size: int
    next_dead: int  # sentinel row of step t+1 (the leaf count at the last step)
    token_of: torch.Tensor  # int64 [V_t], -1 = the SidMap spells no token for the code
    spelled: torch.Tensor  # int64 [n]: codes with a token (all of them for offset maps)
    first_token: int | None  # code c is token first_token + c for every c (offset maps)
    next_flat: torch.Tensor | None  # int64 [(rows+1) * (V_t+1)]: next row, next_dead where none
    keys: torch.Tensor | None  # int64 [nnz]: row * (V_t+1) + code of every child, ascending
    valid: torch.Tensor | None  # bool [rows+1, V_t]: code continues the row (sentinel row all False)
    indptr: torch.Tensor | None  # int64 [rows+2] (sentinel row: no children)
    tokens: torch.Tensor | None  # int64 [nnz]: codes of the children in flat order
    max_slots: int


class VocabMasks:
    """Step tables + SID spelling on one device, for one vocabulary size.

    index: a SidIndex (its `steps[t]` tables: sparse indptr/tokens or dense next).
    token_table: L arrays int64 [V_t], the token of each code (-1 = none), from SidMap.token_table.
    vocab_size: the width of the model's scores; every spelled token must be below it.
    table_bytes: the largest per-step lookup table to build (see the module docstring).
    """

    def __init__(
        self,
        index,
        token_table: Sequence[np.ndarray],
        vocab_size: int,
        device,
        table_bytes: int = TABLE_BYTES,
    ) -> None:
        self.device = torch.device(device)
        self.vocab_size = int(vocab_size)
        self.num_steps = len(index.steps)
        # code_of[t, token] = code of the token at step t, or V_t (not a code); column vocab_size: any
        # token outside the vocabulary.
        code_of = np.empty((self.num_steps, self.vocab_size + 1), dtype=np.int64)
        self.steps: list[_Step] = []
        for t, (table, line) in enumerate(zip(index.steps, token_table, strict=True)):
            if line.size and int(line.max()) >= self.vocab_size:
                raise InputError(
                    f"token {int(line.max())} of step {t} is outside the model's vocabulary ({vocab_size})"
                )
            spelled = np.flatnonzero(line >= 0)
            code_of[t] = table.codebook_size
            code_of[t, line[spelled]] = spelled
            next_dead = index.steps[t + 1].rows if t + 1 < self.num_steps else index.num_leaves
            self.steps.append(self._step(table, line, spelled, int(next_dead), table_bytes))
        self.code_of = torch.as_tensor(code_of, device=self.device)

    def _step(self, table, line: np.ndarray, spelled: np.ndarray, next_dead: int, table_bytes: int) -> _Step:
        dev = self.device
        rows, size = int(table.rows), int(table.codebook_size)
        if table.next is not None:
            dense = np.asarray(table.next, dtype=np.int64)
            parent, code = np.nonzero(dense >= 0)
            child = dense[parent, code]
            order = np.argsort(child)  # flat child order: next rows are numbered in it
            parent, code = parent[order], code[order]
        else:
            indptr = np.asarray(table.indptr, dtype=np.int64)
            parent = np.repeat(np.arange(rows, dtype=np.int64), np.diff(indptr))
            code = np.asarray(table.tokens, dtype=np.int64)
        nnz = code.shape[0]
        key = parent * (size + 1) + code  # ascending: rows ascending, codes ascending within a row
        next_flat = keys = valid = None
        if (rows + 1) * (size + 1) * 8 <= table_bytes:
            flat = np.full((rows + 1) * (size + 1), next_dead, dtype=np.int64)
            flat[key] = np.arange(nnz, dtype=np.int64)
            next_flat = torch.as_tensor(flat, device=dev)
        else:
            keys = torch.as_tensor(key, device=dev)
        if (rows + 1) * size <= table_bytes:
            cells = np.zeros((rows + 1, size), dtype=bool)
            cells[parent, code] = True
            valid = torch.as_tensor(cells, device=dev)
        indptr_ext = np.concatenate([np.searchsorted(parent, np.arange(rows + 1)), [nnz]]).astype(np.int64)
        contiguous = spelled.size == line.size and np.array_equal(line, line[0] + np.arange(line.size))
        return _Step(
            rows=rows,
            codebook_size=size,
            next_dead=next_dead,
            token_of=torch.as_tensor(line, device=dev),
            spelled=torch.as_tensor(spelled, device=dev),
            first_token=int(line[0]) if contiguous and line.size else None,
            next_flat=next_flat,
            keys=keys,
            valid=valid,
            indptr=None if valid is not None else torch.as_tensor(indptr_ext, device=dev),
            tokens=None if valid is not None else torch.as_tensor(code, device=dev),
            max_slots=int(table.max_slots),
        )

    def rows(self, generated: torch.Tensor) -> torch.Tensor:
        """int64 [R]: the row of step t reached by generated int [R, t]; a prefix outside the catalog gets
        the sentinel row (step t's row count; the leaf count when t = L)."""
        generated = generated.to(self.device).long().clamp(0, self.vocab_size)
        rows = torch.zeros(generated.shape[0], dtype=torch.int64, device=self.device)
        for s, step in enumerate(self.steps[: generated.shape[1]]):
            code = self.code_of[s].take(generated[:, s])
            key = rows * (step.codebook_size + 1) + code
            if step.next_flat is not None:
                rows = step.next_flat.take(key)
            else:
                pos = torch.searchsorted(step.keys, key).clamp_(max=step.keys.shape[0] - 1)
                rows = torch.where(step.keys.take(pos) == key, pos, step.next_dead)
        return rows

    def apply(self, scores: torch.Tensor, rows: torch.Tensor, t: int) -> torch.Tensor:
        """scores fp [R, vocab] -> a new tensor: scores at tokens spelling a child of each beam's row of
        step t (none on the sentinel row), -inf everywhere else."""
        step = self.steps[t]
        neg_inf = float("-inf")
        out = torch.full_like(scores, neg_inf)
        if step.valid is not None:
            valid = step.valid.index_select(0, rows)  # [R, V_t]
            if step.first_token is not None:
                lo, hi = step.first_token, step.first_token + step.codebook_size
                out[:, lo:hi] = torch.where(valid, scores[:, lo:hi], neg_inf)
            else:
                cols = step.token_of.index_select(0, step.spelled)
                kept = torch.where(valid.index_select(1, step.spelled), scores.index_select(1, cols), neg_inf)
                out.index_copy_(1, cols, kept)
            return out
        start = step.indptr.take(rows)
        count = step.indptr.take(rows + 1) - start
        slot = torch.arange(step.max_slots, device=self.device)
        codes = step.tokens.take((start[:, None] + slot).clamp_(max=step.tokens.shape[0] - 1))
        cols = codes + step.first_token if step.first_token is not None else step.token_of.take(codes)
        # Unused slots repeat slot 0's column, so every write to a column carries the same value (scatter
        # with duplicate indices keeps an arbitrary one); a row without children writes -inf.
        cols = torch.where(slot < count[:, None], cols, cols[:, :1])
        kept = torch.where((count > 0)[:, None], scores.gather(1, cols), neg_inf)
        return out.scatter_(1, cols, kept)

    def apply_eos(self, scores: torch.Tensor, rows: torch.Tensor, eos_token_id: int) -> torch.Tensor:
        """scores -> -inf everywhere but EOS, kept where rows (leaves, from rows() after L steps) are real."""
        out = torch.full_like(scores, float("-inf"))
        complete = rows < self.steps[-1].next_dead
        out[:, eos_token_id] = torch.where(complete, scores[:, eos_token_id], out[:, eos_token_id])
        return out


__all__ = ["TABLE_BYTES", "VocabMasks"]
