"""The correctness gate of tune: a scoring mode (a kernel) against the torch reference on random inputs.

`make_case` builds the random selective-scoring case - the same one the kernel tests use (through
zerogr_build.testing) - and `check_mode_against_reference` compares both contract functions on it,
element by element.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..base.dtypes import dtype_name, torch_dtype

# (rtol, atol) per dtype for kernel vs reference. Both read identically rounded inputs and accumulate in fp32,
# so they differ only by summation order (~1e-6 for the O(1) scores of make_case); the bound is the same
# tight one for every dtype, far below the precision of fp16/bf16 themselves.
CHECK_TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (1e-4, 1e-4), "bf16": (1e-4, 1e-4)}


class SelectiveCase(NamedTuple):
    """Inputs of one selective-scoring call (unpack with *case).

    Shape: hidden [R, d], weight [V, d], bias [V] | None (all of one dtype), slot_tokens int32 [R, K]."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    slot_tokens: torch.Tensor


def make_case(
    seed: int | torch.Generator,
    dtype: str | torch.dtype,
    rows: int,
    slots: int,
    dim: int,
    vocab: int,
    *,
    with_bias: bool = True,
    device: str | torch.device = "cpu",
) -> SelectiveCase:
    """Fresh random inputs with every kind of slot the contract names.

    Args:
        seed: a seed, or a torch.Generator to draw from (CPU).
        dtype: of hidden, weight and bias ("fp32", torch.bfloat16, ...).
        rows, slots, dim, vocab: R, K, d, V.
        with_bias: draw a bias (else None).
        device: where the tensors end up (drawn on the CPU, so a seed gives the same case everywhere).

    About 30% of slots are empty (-1); row 0 has no valid slot (R > 1); row 1 has every slot valid (R > 2);
    two tokens are out of range, V and -7 (R * K > 4), and must behave as empty. Scores are O(1): hidden
    is scaled by 1/sqrt(d)."""
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    tdt = torch_dtype(dtype_name(dtype))
    hidden = (torch.randn(rows, dim, generator=gen) / max(1, dim) ** 0.5).to(tdt)
    weight = torch.randn(vocab, dim, generator=gen).to(tdt)
    bias = torch.randn(vocab, generator=gen).to(tdt) if with_bias else None
    tokens = torch.randint(0, vocab, (rows, slots), generator=gen, dtype=torch.int32)
    tokens[torch.rand(rows, slots, generator=gen) < 0.3] = -1
    if rows > 2:
        tokens[1] = torch.randint(0, vocab, (slots,), generator=gen, dtype=torch.int32)
    if rows > 1:
        tokens[0] = -1
    if rows * slots > 4:
        flat = tokens.view(-1)
        flat[1], flat[-1] = vocab, -7
    return SelectiveCase(*(None if t is None else t.to(device) for t in (hidden, weight, bias, tokens)))


# (rows, slots, d, vocab or None = the bundle's, weight row padding) checked after the main case.
GATE_CASES = (
    (4, 200, 128, None, 0),  # small R, wide K: two-pass path (R below the SM count, K > 64)
    (8, 40, 70, None, 2),  # d % 8 != 0 in a padded view: vector loads plus a scalar tail
    (2, 8, 13000, 64, 0),  # 52 KB hidden row: the kernels' shared-memory opt-in
)


def check_mode_against_reference(
    mode: Any,
    reference: Any,
    device: str,
    dtype: str,
    *,
    vocab: int,
    hidden_dim: int,
    rows: int = 64,
    slots: int = 24,
    seed: int = 1234,
) -> str | None:
    """Compare a scoring mode with the reference on a fresh `make_case` on `device`; None if they agree,
    else one line saying where they differ.

    Both contract functions (mode.selective_scores / selective_log_softmax), with and without bias, every
    element: same -inf pattern, no NaN, finite values within CHECK_TOLERANCE[dtype]. A mode that raises is
    reported, not propagated.

    Cases (GATE_CASES): (rows, slots) at d = hidden_dim first, then what else gets served: a small-R,
    wide-K case (the two-pass path: several score chunks, then the in-place row log-softmax), a d that is
    not a multiple of 8 in a padded weight view (vector loads plus a scalar tail) and a d whose hidden row
    needs the shared-memory opt-in (above 48 KB)."""
    for case_rows, case_slots, dim, case_vocab, pad in ((rows, slots, hidden_dim, vocab, 0), *GATE_CASES):
        problem = _check_case(
            mode, reference, device, dtype, (case_rows, case_slots, dim, case_vocab or vocab), pad, seed
        )
        if problem is not None:
            return f"{problem} [R={case_rows}, K={case_slots}, d={dim}{', padded rows' if pad else ''}]"
    return None


def _check_case(mode: Any, reference: Any, device: str, dtype: str, shape: tuple, pad: int, seed: int):
    rows, slots, dim, vocab = shape
    case = make_case(seed, dtype, rows, slots, dim, vocab, device=device)
    weight = case.weight
    if pad:  # the same weight in rows `pad` elements wider than d: a view, as a sliced matrix would be
        weight = torch.zeros(vocab, dim + pad, dtype=weight.dtype, device=weight.device)[:, :dim]
        weight.copy_(case.weight)
    rtol, atol = CHECK_TOLERANCE[dtype]
    for fn_name in ("selective_scores", "selective_log_softmax"):
        for bias in (None, case.bias):
            args = (case.hidden, weight, bias, case.slot_tokens)
            want = getattr(reference, fn_name)(*args).float().cpu()
            try:
                got = getattr(mode, fn_name)(*args)
            except Exception as exc:  # noqa: BLE001 - a kernel that crashes is refused, not fatal
                return f"{fn_name} raised {type(exc).__name__}: {exc}"
            what = f"{fn_name} ({dtype}, bias={'yes' if bias is not None else 'no'})"
            problem = _difference(got.float().cpu(), want, rtol, atol)
            if problem is not None:
                return f"{what}: {problem}"
    return None


def _difference(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    """Where got differs from want (shape, NaN, -inf pattern, then values), or None."""
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)}, reference {tuple(want.shape)}"
    if torch.isnan(got).any():
        r, k = (int(x) for x in torch.nonzero(torch.isnan(got))[0])
        return f"NaN at row {r} slot {k}"
    if not torch.equal(torch.isneginf(got), torch.isneginf(want)):
        r, k = (int(x) for x in torch.nonzero(torch.isneginf(got) != torch.isneginf(want))[0])
        return f"-inf pattern differs at row {r} slot {k} ({float(got[r, k])} vs reference)"
    finite = torch.isfinite(want)
    diff = (got[finite] - want[finite]).abs()
    bound = atol + rtol * want[finite].abs()
    if not (diff > bound).any():
        return None
    worst = int(torch.argmax(diff - bound))
    r, k = (int(x) for x in torch.nonzero(finite)[worst])
    return (
        f"row {r} slot {k} = {float(got[r, k]):.6g}, reference {float(want[r, k]):.6g} "
        f"(tolerance rtol={rtol}, atol={atol})"
    )


__all__ = ["CHECK_TOLERANCE", "GATE_CASES", "SelectiveCase", "check_mode_against_reference", "make_case"]
