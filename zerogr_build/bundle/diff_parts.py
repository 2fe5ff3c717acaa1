"""The ids of `zerogr diff`'s matching as arrays (bundle/diff.py streams the files and calls these): one
batch of a version's item ids hashed into a `Part`, parts taken, joined, spilled into 2^k part files and
loaded back, and the `Leftovers` of the leaf-order merge (held in memory, or spilled past the matching
budget). The file handling is here; the arithmetic is id_match's.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from ..base.errors import BundleError
from ..base.progress import Progress
from . import id_match as im


@dataclass
class Part:
    """Ids of one version: hashes uint64 [n], packed SIDs uint64 [n, W] (W = 0: not compared), and for
    string ids their (offsets int64 [n+1], data uint8); offsets index `data` and need not start at 0."""

    hashes: np.ndarray
    keys: np.ndarray
    strings: tuple[np.ndarray, np.ndarray] | None

    def __len__(self) -> int:
        return int(self.hashes.shape[0])

    def nbytes(self) -> int:
        """Bytes its arrays hold (string ids: their bytes and offsets)."""
        size = self.hashes.nbytes + self.keys.nbytes
        if self.strings is not None:
            offsets, _ = self.strings
            size += offsets.nbytes + int(offsets[-1] - offsets[0])
        return size

    def tail(self, start: int) -> Part:
        """Its ids from `start` on (views: string ids keep the whole data buffer)."""
        strings = None if self.strings is None else (self.strings[0][start:], self.strings[1])
        return Part(self.hashes[start:], self.keys[start:], strings)

    def take(self, mask: np.ndarray, words: int) -> Part:
        """Its first mask.shape[0] ids where `mask` (bool) is set, with `words` key words kept (0: none)."""
        if mask.all():  # every one (a model update: nothing under the same SID): views, no copy
            count = mask.shape[0]
            texts = None if self.strings is None else (self.strings[0][: count + 1], self.strings[1])
            keys = self.keys[:count, :words] if words else np.zeros((count, 0), dtype=np.uint64)
            return Part(self.hashes[:count], keys, texts)
        where = np.flatnonzero(mask)
        keys = self.keys[where, :words] if words else np.zeros((where.shape[0], 0), dtype=np.uint64)
        strings = None
        if self.strings is not None:
            offsets, data = self.strings
            taken = gather_bytes(offsets, data, where)
            lengths = np.diff(offsets)[where]
            strings = (np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)]), taken)
        return Part(self.hashes[where], keys, strings)


def hash_ids(ids: pa.Array, kind: str, seed: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """(hashes uint64 [n], strings) of one batch of ids under `seed`: `kind` "bytes" (strings: their
    (offsets, data)), "int" or "mixed" (strings None; int_values)."""
    if kind == "bytes":
        strings = byte_buffers(ids.cast(pa.large_binary()))
        return im.hash_byte_ids(*strings, seed), strings
    return im.hash_int_ids(int_values(ids, kind), seed), None


def concat(parts: list[Part], words: int) -> Part:
    """One Part of several (string ids: their offsets joined)."""
    hashes = np.concatenate([b.hashes for b in parts]) if parts else np.zeros(0, dtype=np.uint64)
    keys = np.concatenate([b.keys for b in parts]) if parts else np.zeros((0, words), dtype=np.uint64)
    strings = None
    if parts and parts[0].strings is not None:
        lengths = np.concatenate([np.diff(b.strings[0]) for b in parts if b.strings is not None])
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        data = np.concatenate([b.strings[1][b.strings[0][0] : b.strings[0][-1]] for b in parts if b.strings])
        strings = (offsets, data)
    return Part(hashes, keys, strings)


def spill(parts: Iterable[Part], where: Path, part_bits: int) -> None:
    """Append the ids of `parts` to one set of files per part (2^part_bits, by the top bits of the hash:
    id_match.part_of) under `where` (created if missing): hashes, SIDs, and for string ids their lengths
    and bytes. Each call opens the files once."""
    where.mkdir(exist_ok=True)
    batches = [p for p in parts if len(p)]
    if not batches:
        return
    count = 1 << part_bits
    strings = batches[0].strings is not None
    names = ("hashes", "keys", "lengths", "data") if strings else ("hashes", "keys")
    sorted_parts = []
    for batch in batches:
        part = im.part_of(batch.hashes, part_bits)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(count + 1), side="left")
        lengths = data = ends = None
        if batch.strings is not None:
            offsets, raw = batch.strings
            lengths = np.diff(offsets)[order]
            data = gather_bytes(offsets, raw, order)
            ends = np.concatenate([[0], np.cumsum(lengths)])
        sorted_parts.append((bounds, batch.hashes[order], batch.keys[order], lengths, data, ends))
    for k in range(count):
        if all(bounds[k] == bounds[k + 1] for bounds, *_ in sorted_parts):
            continue
        files = [open(where / f"{k}.{n}", "ab") for n in names]  # noqa: SIM115 - closed below
        try:
            for bounds, hashes, keys, lengths, data, ends in sorted_parts:
                lo, hi = bounds[k], bounds[k + 1]
                if lo == hi:
                    continue
                files[0].write(memoryview(hashes[lo:hi]).cast("B"))
                if keys.shape[1]:
                    files[1].write(memoryview(np.ascontiguousarray(keys[lo:hi])).cast("B"))
                if strings:
                    files[2].write(memoryview(lengths[lo:hi]).cast("B"))
                    files[3].write(memoryview(data[ends[lo] : ends[hi]]).cast("B"))
        finally:
            for f in files:
                f.close()


def load(where: Path, k: int, words: int, strings: bool) -> Part:
    """Part k of the ids spilled to `where` (no file: no ids)."""

    def read(name: str, dtype: type) -> np.ndarray:
        path = where / f"{k}.{name}"
        return np.fromfile(path, dtype=dtype) if path.exists() else np.zeros(0, dtype=dtype)

    hashes = read("hashes", np.uint64)
    keys = read("keys", np.uint64).reshape(hashes.shape[0], words)
    texts = None
    if strings:
        lengths = read("lengths", np.int64)
        texts = (np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)]), read("data", np.uint8))
    return Part(hashes, keys, texts)


def gather_bytes(offsets: np.ndarray, data: np.ndarray, order: np.ndarray) -> np.ndarray:
    """uint8: the strings offsets/data in `order`, end to end."""
    strings = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), offsets.shape[0] - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    taken_offsets, taken_data = byte_buffers(strings.take(pa.array(order)))
    return taken_data[taken_offsets[0] : taken_offsets[-1]]


def int_values(ids: pa.Array, kind: str) -> np.ndarray:
    """int64 [n] of integer ids. "mixed" (uint64 against signed ids): a uint64 id past int64 equals no
    signed id, so it is refused rather than wrapped into one."""
    values = ids.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64:
        if kind == "mixed" and values.size and values.max() > np.iinfo(np.int64).max:
            raise BundleError("item ids past 2^63-1 (uint64) cannot be compared with signed item ids")
        return values.view(np.int64)
    return values.astype(np.int64, copy=False)


def byte_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n+1], data uint8) of a large_binary array (its slice offset applied)."""
    buffers = ids.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[ids.offset : ids.offset + len(ids) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


class Matcher(Protocol):
    """What Leftovers needs of the diff's matching: the part count, the spill of one version's parts, a
    part loaded back, the join of two versions' ids (how many in both), and the progress."""

    part_bits: int
    progress: Progress

    def spill(self, parts: list[Part], where: Path) -> Path: ...

    def load(self, where: Path, k: int) -> Part: ...

    def join(self, a: Part, b: Part) -> int: ...


class Leftovers:
    """Both versions' leftover ids (no SIDs: a leftover found in both versions changed its SID), held
    in memory while their matching fits `budget`; past it, spilled to part files in a temporary dir
    (entered on `stack`), appended in chunks of a quarter of the budget."""

    def __init__(
        self,
        match: Matcher,
        budget: int,
        stack: contextlib.ExitStack,
        prefix: str,
        spill_dir: str | Path | None,
    ) -> None:
        self.match, self.budget, self.stack = match, budget, stack
        self.prefix, self.spill_dir = prefix, spill_dir
        self.held: tuple[list[Part], list[Part]] = ([], [])
        self.need = 0.0
        self.where: Path | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._spilling: Future | None = None

    def add(self, side: int, part: Part) -> None:
        """Hold (or spill) `part`'s ids as leftovers of version `side` (0 old, 1 new)."""
        if not len(part):
            return
        self.held[side].append(Part(part.hashes, np.zeros((len(part), 0), np.uint64), part.strings))
        self.need += 2 * part.nbytes() + 8 * len(part)
        if self.need > (self.budget if self.where is None else self.budget / 4):
            self.flush()

    def flush(self) -> None:
        """Hand what is held to the spill thread (the temporary dir and the thread made on the first call),
        after the spill before it has finished (its error raised here)."""
        if self.where is None:
            self.where = Path(
                self.stack.enter_context(tempfile.TemporaryDirectory(prefix=self.prefix, dir=self.spill_dir))
            )
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerogr-diff-spill")
            self.stack.callback(self._writer.shutdown)  # before the dir is removed: the stack is LIFO
        chunk = (list(self.held[0]), list(self.held[1]))
        for held in self.held:
            held.clear()
        self.need = 0.0
        self._wait()
        assert self._writer is not None
        self._spilling = self._writer.submit(self._spill, chunk, self.where)

    def _spill(self, chunk: tuple[list[Part], list[Part]], where: Path) -> None:
        for side, name in enumerate("ab"):
            self.match.spill(chunk[side], where / name)

    def _wait(self) -> None:
        spilling, self._spilling = self._spilling, None
        if spilling is not None:
            spilling.result()

    def matched(self) -> int:
        """How many leftover ids are in both versions."""
        if self.where is None:
            sides = []
            for held in self.held:  # joined, then let go: the matching holds one copy besides its own
                sides.append(concat(held, 0))
                held.clear()
            return self.match.join(*sides)
        self.flush()
        self._wait()
        parts = 1 << self.match.part_bits
        self.match.progress.stage("diff: match", parts)
        common = 0
        for k in range(parts):
            common += self.match.join(*(self.match.load(self.where / name, k) for name in "ab"))
            self.match.progress.advance(1)
        return common
