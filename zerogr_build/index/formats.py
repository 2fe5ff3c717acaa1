"""Per-step format choice (sparse or dense) and the smallest dtypes the format allows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..base.errors import InputError
from .tables import StepFormat

FORMAT_CHOICES = ("auto", "sparse", "dense")


@dataclass(frozen=True)
class FormatPolicy:
    """How `auto` picks a step's format.

    A step is stored dense when both hold:
      valid_share >= dense_min_share   (nearly every cell of the [rows, V] table is a real child), and
      dense bytes <= dense_max_bytes   (rows * V * 4 bytes; keeps wide late steps sparse whatever they are).
    Why 0.9: a dense step costs 4 bytes per cell, a sparse one 2 (uint16 token) per child plus 4 per row,
    so dense is about 2 / valid_share times larger. It needs no slot lookup (slot k is token k) and its
    scores line up with full scoring, which pays for ~2x bytes on full early steps (step 0 of most
    catalogs), not for the 3-8x it would cost on half-empty ones.
    """

    dense_min_share: float = 0.9
    dense_max_bytes: int = 256 * 1024 * 1024
    forced_dense_limit: int | None = None  # bytes a *forced* dense table may take (None: no limit)
    forced_dense_limit_what: str = "this machine's memory"  # what sets that limit (for the message)


def bits_for(count: int) -> int:
    """Bits needed to store the values 0 .. count-1 (at least 1, so a count of 1 still takes a bit)."""
    return max(1, int(count - 1).bit_length())


def token_dtype(codebook_size: int) -> np.dtype:
    """uint16 when every token fits (V <= 65536), else int32."""
    return np.dtype(np.uint16) if codebook_size <= 65536 else np.dtype(np.int32)


def indptr_dtype(nnz: int) -> np.dtype:
    """int32 while the largest offset fits, else int64."""
    return np.dtype(np.int32) if nnz < 2**31 else np.dtype(np.int64)


def choose_format(
    rows: int, nnz: int, codebook_size: int, forced: str, policy: FormatPolicy, step: int | None = None
) -> StepFormat:
    """Resolve one step's format: `forced` is "auto", "sparse" or "dense". A forced dense table larger
    than policy.forced_dense_limit is refused (InputError naming `step`) before anything is allocated."""
    dense_bytes = rows * codebook_size * 4
    limit = policy.forced_dense_limit
    if forced == "dense" and limit is not None and dense_bytes > limit:
        raise forced_dense_error(
            step, rows, codebook_size, f"more than {policy.forced_dense_limit_what} ({limit} bytes)"
        )
    if forced in ("sparse", "dense"):
        return forced  # type: ignore[return-value]
    share = nnz / (rows * codebook_size) if rows else 0.0
    if share >= policy.dense_min_share and dense_bytes <= policy.dense_max_bytes:
        return "dense"
    return "sparse"


def check_step_formats(spec: str | Mapping[int, str] | None) -> dict[int, str] | str:
    """The syntax of a --step-formats spec, checked without knowing the SID length: "auto", "sparse" or
    "dense" (returned as that string), or "STEP=FORMAT,..." (returned as {step: format}) where every STEP
    is an ASCII number named once and every FORMAT is auto|sparse|dense. InputError otherwise. Whether
    each step exists is parse_step_formats's check, once the length is known."""
    if spec is None:
        return "auto"
    if isinstance(spec, str):
        spec = spec.strip()
        if spec in ("", *FORMAT_CHOICES):
            return spec or "auto"
        items: dict[int, str] = {}
        for part in spec.split(","):
            step_text, sep, fmt = part.partition("=")
            step_text = step_text.strip()
            if not sep or not (step_text.isascii() and step_text.isdigit()):
                raise InputError(f"--step-formats: expected STEP=FORMAT, got {part!r}")
            if int(step_text) in items:
                raise InputError(f"--step-formats: step {int(step_text)} named twice")
            items[int(step_text)] = fmt.strip()
        spec = items
    checked: dict[int, str] = {}
    for step, fmt in spec.items():
        if fmt not in FORMAT_CHOICES:
            raise InputError(f"--step-formats: unknown format {fmt!r} for step {step} (auto|sparse|dense)")
        checked[int(step)] = fmt
    return checked


def forced_dense_error(step: int | None, rows: int, codebook_size: int, why: str) -> InputError:
    """The refusal of a forced dense table that cannot be allocated (`why`: what it exceeds)."""
    which = "a dense table" if step is None else f"a dense table for step {step}"
    return InputError(
        f"--step-formats forces {which}: {rows} rows x {codebook_size} tokens x 4 bytes = "
        f"{rows * codebook_size * 4} bytes, {why}: store that step sparse"
    )


def parse_step_formats(spec: str | Mapping[int, str] | None, num_steps: int) -> dict[int, str]:
    """Parse "auto", "sparse", "dense" (every step) or "0=dense,2=sparse" (or a mapping) into {step: format}.

    Steps not named stay "auto". Raises InputError for bad syntax (check_step_formats), a step out of range
    or an unknown format.
    """
    checked = check_step_formats(spec)
    if isinstance(checked, str):
        return {t: checked for t in range(num_steps)}
    formats = {t: "auto" for t in range(num_steps)}
    for step, fmt in checked.items():
        if not 0 <= step < num_steps:
            raise InputError(f"--step-formats: step {step} out of range 0..{num_steps - 1}")
        formats[step] = fmt
    return formats
