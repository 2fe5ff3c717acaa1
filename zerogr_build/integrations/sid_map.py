"""How a model spells SIDs in its vocabulary: code c of step t is one token id (numpy only, no torch).

    sid_map = SidMap.from_offsets([o_0, ..., o_{L-1}], eos_token_id=None)   # token = o_t + c (TIGER)
    sid_map = SidMap.from_table({token: (step, code), ...})                 # any explicit spelling
    tokens = sid_map.token_table(codebook_sizes)   # L arrays int64 [V_t]: token of each code, -1 = none
    sid_map.save("sid_map.json"); sid_map = SidMap.load("sid_map.json")   # the JSON form (below)

Offsets may overlap (one shared code vocabulary for every step): a token is only ever read at a known
step, so only (step, code) -> token must be one-to-one within a step. `eos_token_id`, when given, is the
token forced after the last step and must not spell any code.

The JSON form (`zerogr compare --sid-map FILE`) is one object, either
    {"format": "zerogr-sid-map", "format_version": 1, "offsets": [3, 259, 515], "eos_token_id": 1}
or
    {"format": "zerogr-sid-map", "format_version": 1, "table": [[token, step, code], ...]}
`format` and `format_version` may be left out; when present they must be exactly these. Exactly one of
`offsets` / `table`; `eos_token_id` optional (null = none); integers are JSON integers (not 1.0, not
true) from 0 to 2**63 - 1 (int64); any other key is refused, so a misspelt one is not silently ignored.
At most 64 MiB. Whether the tokens fit a model's vocabulary is checked against the model
(check_vocabulary).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import InputError
from ..base.small_files import read_small_json

SID_MAP_FORMAT = "zerogr-sid-map"
SID_MAP_FORMAT_VERSION = 1
MAX_SID_MAP_BYTES = 64 << 20
INT64_MAX = int(np.iinfo(np.int64).max)
_SID_MAP_KEYS = {"format", "format_version", "offsets", "table", "eos_token_id"}


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
        values = tuple(_non_negative_int(o, f"offsets[{t}]") for t, o in enumerate(offsets))
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
        arr = np.array(
            [[_non_negative_int(v, f"table row {i}") for v in r] for i, r in enumerate(rows)], dtype=np.int64
        )
        steps = np.unique(arr[:, 1])
        if not np.array_equal(steps, np.arange(steps.shape[0])):
            raise InputError(f"SidMap table steps must be 0..L-1 with none missing, got {steps.tolist()}")
        for cols, what in (([1, 2], "(step, code)"), ([0, 1], "(token, step)")):
            pairs, counts = np.unique(arr[:, cols], axis=0, return_counts=True)
            if (counts > 1).any():
                raise InputError(f"SidMap table repeats the {what} pair {pairs[counts > 1][0].tolist()}")
        return cls(offsets=None, table=arr, eos_token_id=_optional_token(eos_token_id))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (module docstring): offsets or table rows (token, step, code), and eos_token_id."""
        out: dict[str, Any] = {"format": SID_MAP_FORMAT, "format_version": SID_MAP_FORMAT_VERSION}
        if self.offsets is not None:
            out["offsets"] = list(self.offsets)
        else:
            out["table"] = self.table.tolist()
        out["eos_token_id"] = self.eos_token_id
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "sid map") -> SidMap:
        """A SidMap from its JSON form, every rule checked; InputError naming `where` and the rule."""
        if not isinstance(data, Mapping):
            raise InputError(f"{where}: a sid map must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - _SID_MAP_KEYS, key=str)
        if unknown:
            raise InputError(
                f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_SID_MAP_KEYS))})"
            )
        for name, want in (("format", SID_MAP_FORMAT), ("format_version", SID_MAP_FORMAT_VERSION)):
            if name in data and (type(data[name]) is not type(want) or data[name] != want):
                raise InputError(f"{where}: {name} must be {want!r}, got {data[name]!r}")
        if ("offsets" in data) == ("table" in data):
            raise InputError(f"{where}: needs exactly one of 'offsets' and 'table'")
        eos = data.get("eos_token_id")
        if eos is not None and type(eos) is not int:
            raise InputError(f"{where}: eos_token_id must be an integer or null, got {eos!r}")
        try:
            if "offsets" in data:
                offsets = data["offsets"]
                if not isinstance(offsets, list) or any(type(o) is not int for o in offsets):
                    raise InputError(f"offsets must be a list of integers, got {offsets!r}"[:200])
                return cls.from_offsets(offsets, eos_token_id=eos)
            table = data["table"]
            if not isinstance(table, list) or not all(
                isinstance(row, list) and len(row) == 3 and all(type(v) is int for v in row) for row in table
            ):
                raise InputError("table must be a list of [token, step, code] integer rows")
            return cls.from_table(table, eos_token_id=eos)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None

    def save(self, path: str | Path) -> Path:
        """Write the JSON form to `path` (replaced atomically: a crash leaves the old file or the new)."""
        path = Path(path)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(json.dumps(self.to_dict()) + "\n", encoding="utf-8")
        temp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> SidMap:
        """Read a JSON sid map (module docstring); InputError naming the file and the first broken rule."""
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: sid map file not found (or not a regular file)")
        data = read_small_json(path, MAX_SID_MAP_BYTES, "sid map")
        return cls.from_dict(data, str(path))

    @property
    def num_steps(self) -> int:
        return len(self.offsets) if self.offsets is not None else int(self.table[:, 1].max()) + 1

    def token_table(self, codebook_sizes: Sequence[int]) -> tuple[np.ndarray, ...]:
        """L arrays int64 [V_t]: the token of each code of step t, -1 where the map spells none."""
        sizes = [int(v) for v in codebook_sizes]
        if len(sizes) != self.num_steps:
            raise InputError(f"SidMap has {self.num_steps} steps, the index has {len(sizes)}")
        if self.offsets is not None:
            for t, (o, v) in enumerate(zip(self.offsets, sizes, strict=True)):
                if o + v - 1 > INT64_MAX:
                    raise InputError(f"SidMap offsets[{t}] {o} + codebook size {v} passes the int64 range")
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

    def check_vocabulary(self, codebook_sizes: Sequence[int], vocab_size: int) -> None:
        """InputError naming the key unless every token spelling a code of these codebooks, and
        eos_token_id, is below vocab_size (a model's vocabulary)."""
        if self.eos_token_id is not None and self.eos_token_id >= vocab_size:
            raise InputError(
                f"eos_token_id {self.eos_token_id} is beyond the model's vocabulary (0..{vocab_size - 1})"
            )
        if self.offsets is not None:
            for t, (o, v) in enumerate(zip(self.offsets, codebook_sizes, strict=False)):
                if o + int(v) > vocab_size:
                    raise InputError(
                        f"offsets[{t}] {o} spells codes 0..{int(v) - 1} as tokens up to {o + int(v) - 1}, "
                        f"beyond the model's vocabulary (0..{vocab_size - 1})"
                    )
        for t, line in enumerate(self.token_table(codebook_sizes)):
            if line.size and int(line.max()) >= vocab_size:
                raise InputError(
                    f"table spells a code of step {t} as token {int(line.max())}, beyond the model's "
                    f"vocabulary (0..{vocab_size - 1})"
                )

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
    if isinstance(value, bool) or int(value) != value or not 0 <= int(value) <= INT64_MAX:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:30]}... ({len(repr(value))} chars)"
        raise InputError(f"SidMap {what} must be a non-negative integer up to 2**63 - 1, got {shown}")
    return int(value)


def _optional_token(value) -> int | None:
    return None if value is None else _non_negative_int(value, "eos_token_id")


__all__ = ["SidMap", "catalog_token_table"]
