"""A catalog's step tables on a torch device, read as masks over a model's whole vocabulary.

    masks = VocabMasks(index, token_table, vocab_size, device)
    rows = masks.rows(generated)          # generated int64 [R, t] model tokens -> int64 [R] rows of step t
    allowed = masks.allowed(rows, t)      # bool [R, vocab_size]: the tokens spelling a valid child

Every beam is handled at once (no Python per beam) and nothing is read back to the host, so the masks can
be built inside a CUDA stream / graph. A row is found from the generated tokens alone, by walking the
tables from the root: that is what makes it robust to any reordering of the beams between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError


@dataclass(frozen=True)
class _SparseStep:
    """A sparse step on the device: indptr int64 [rows+1], tokens int64 [nnz], keys int64 [nnz]."""

    indptr: torch.Tensor
    tokens: torch.Tensor
    keys: torch.Tensor  # row * codebook_size + code of every child, in flat child order
    codebook_size: int


class VocabMasks:
    """Step tables + SID spelling on one device, for one vocabulary size.

    index: a SidIndex (its `steps[t]` tables: sparse indptr/tokens or dense next).
    token_table: L arrays int64 [V_t], the token of each code (-1 = none), from SidMap.token_table.
    vocab_size: the width of the model's scores; every spelled token must be below it.
    """

    def __init__(self, index, token_table: Sequence[np.ndarray], vocab_size: int, device) -> None:
        self.device = torch.device(device)
        self.vocab_size = int(vocab_size)
        self.num_steps = len(index.steps)
        dummy = self.vocab_size  # column past the vocabulary: where "no token" / "no code" goes
        code_of = np.full((self.num_steps, dummy + 1), -1, dtype=np.int64)
        self.token_of: list[torch.Tensor] = []
        self.sparse: list[_SparseStep | None] = []
        self.dense_next: list[torch.Tensor | None] = []
        self.max_slots: list[int] = []
        for t, (table, line) in enumerate(zip(index.steps, token_table, strict=True)):
            if line.size and int(line.max()) >= self.vocab_size:
                raise InputError(
                    f"token {int(line.max())} of step {t} is outside the model's vocabulary ({vocab_size})"
                )
            known = np.flatnonzero(line >= 0)
            code_of[t, line[known]] = known
            self.token_of.append(torch.as_tensor(np.where(line >= 0, line, dummy), device=self.device))
            self.max_slots.append(int(table.max_slots))
            if table.next is not None:
                self.dense_next.append(torch.as_tensor(np.asarray(table.next, dtype=np.int64), device=device))
                self.sparse.append(None)
            else:
                indptr = np.asarray(table.indptr, dtype=np.int64)
                tokens = np.asarray(table.tokens, dtype=np.int64)
                # row * V + code is strictly increasing in flat child order (rows ascending, tokens
                # ascending within a row), so a child's flat position - its next row - is a searchsorted.
                keys = np.repeat(np.arange(table.rows, dtype=np.int64), np.diff(indptr)) * table.codebook_size
                self.sparse.append(
                    _SparseStep(
                        indptr=torch.as_tensor(indptr, device=self.device),
                        tokens=torch.as_tensor(tokens, device=self.device),
                        keys=torch.as_tensor(keys + tokens, device=self.device),
                        codebook_size=int(table.codebook_size),
                    )
                )
                self.dense_next.append(None)
        self.code_of = torch.as_tensor(code_of, device=self.device)

    def rows(self, generated: torch.Tensor) -> torch.Tensor:
        """int64 [R]: the row of step t reached by generated int [R, t] (-1: not a catalog prefix)."""
        generated = generated.to(self.device).long()
        rows = torch.zeros(generated.shape[0], dtype=torch.int64, device=self.device)
        for s in range(generated.shape[1]):
            tok = generated[:, s]
            tok = torch.where((tok >= 0) & (tok < self.vocab_size), tok, self.vocab_size)
            code = self.code_of[s][tok]
            ok = (rows >= 0) & (code >= 0)
            safe_row, safe_code = rows.clamp(min=0), code.clamp(min=0)
            nxt = self.dense_next[s]
            if nxt is not None:
                found = nxt[safe_row, safe_code.clamp(max=nxt.shape[1] - 1)]
            else:
                table = self.sparse[s]
                keys = table.keys
                key = safe_row * table.codebook_size + safe_code
                pos = torch.searchsorted(keys, key).clamp(max=keys.shape[0] - 1)
                found = torch.where(keys[pos] == key, pos, -1)
            rows = torch.where(ok, found, -1)
        return rows

    def allowed(self, rows: torch.Tensor, step: int) -> torch.Tensor:
        """bool [R, vocab_size]: True at the tokens spelling a child of each beam's row (none at row -1)."""
        alive = rows >= 0
        safe = rows.clamp(min=0)
        nxt = self.dense_next[step]
        if nxt is not None:
            valid = (nxt[safe] >= 0) & alive[:, None]
            cols = self.token_of[step].expand(rows.shape[0], -1)
        else:
            table = self.sparse[step]
            start = table.indptr[safe]
            count = torch.where(alive, table.indptr[safe + 1] - start, 0)
            slot = torch.arange(self.max_slots[step], device=self.device)
            valid = slot < count[:, None]
            flat = (start[:, None] + slot).clamp(max=table.tokens.shape[0] - 1)
            cols = self.token_of[step][table.tokens[flat]]
        cols = torch.where(valid, cols, self.vocab_size)
        mask = torch.zeros(rows.shape[0], self.vocab_size + 1, dtype=torch.bool, device=self.device)
        return mask.scatter_(1, cols, True)[:, : self.vocab_size]


__all__ = ["VocabMasks"]
