"""integrations.hf without a model: SidMap spellings and SidLogitsProcessor masks against a dict trie.

The reference is the usual research code: a Python dict trie of the catalog's token sequences; the
allowed tokens after a generated prefix are its children (EOS after a complete SID, when configured).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.index import build_index

pytest.importorskip("transformers")
from zerogr_build.integrations import hf  # noqa: E402


def trie_children(sids: np.ndarray, token_table, eos: int | None) -> dict[tuple[int, ...], set[int]]:
    """{token prefix: allowed next tokens} of every catalog prefix, straight from the definition."""
    trie: dict[tuple[int, ...], set[int]] = {}
    for sid in np.asarray(sids).tolist():
        tokens = tuple(int(token_table[t][c]) for t, c in enumerate(sid))
        for t in range(len(tokens)):
            trie.setdefault(tokens[:t], set()).add(tokens[t])
        if eos is not None:
            trie.setdefault(tokens, set()).add(eos)
    return trie


# ---------------------------------------------------------------- SidMap
def test_from_offsets_spells_token_offset_plus_code() -> None:
    sid_map = hf.SidMap.from_offsets([10, 20, 30], eos_token_id=1)
    table = sid_map.token_table([3, 4, 2])
    assert [t.tolist() for t in table] == [[10, 11, 12], [20, 21, 22, 23], [30, 31]]
    codes = sid_map.to_codes([[10, 23, 31], [9, 20, 32]], [3, 4, 2])
    assert codes.tolist() == [[0, 3, 1], [-1, 0, -1]]


def test_from_table_mapping_and_rows_agree() -> None:
    mapping = {7: (0, 1), 5: (0, 0), 9: (1, 2), 6: (1, 0)}
    a = hf.SidMap.from_table(mapping)
    b = hf.SidMap.from_table([[tok, s, c] for tok, (s, c) in mapping.items()])
    for m in (a, b):
        assert [t.tolist() for t in m.token_table([2, 3])] == [[5, 7], [6, -1, 9]]
        assert m.to_codes([[7, 9], [9, 6]], [2, 3]).tolist() == [[1, 2], [-1, 0]]


def test_shared_code_vocabulary_across_steps() -> None:
    sid_map = hf.SidMap.from_table([[4, 0, 0], [4, 1, 0], [5, 0, 1], [5, 1, 1]])
    assert [t.tolist() for t in sid_map.token_table([2, 2])] == [[4, 5], [4, 5]]
    assert hf.SidMap.from_offsets([3, 3]).to_codes([[4, 3]], [2, 2]).tolist() == [[1, 0]]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: hf.SidMap.from_offsets([]), "one offset per step"),
        (lambda: hf.SidMap.from_offsets([3, -1]), "non-negative"),
        (lambda: hf.SidMap.from_offsets([3, 7], eos_token_id=8).token_table([4, 4]), "also spells"),
        (lambda: hf.SidMap.from_offsets([3, 7]).token_table([4, 4, 4]), "2 steps"),
        (lambda: hf.SidMap.from_table({4: (0, 0), 5: (0, 0)}), r"repeats the \(step, code\)"),
        (lambda: hf.SidMap.from_table([[4, 0, 0], [4, 0, 1]]), r"repeats the \(token, step\)"),
        (lambda: hf.SidMap.from_table({4: (1, 0)}), "steps must be 0..L-1"),
        (lambda: hf.SidMap.from_table({4: (0, 5)}).token_table([3]), "beyond its codebook size"),
    ],
)
def test_sid_map_rejects(build, match: str) -> None:
    with pytest.raises(InputError, match=match):
        build()


# ---------------------------------------------------------------- processor masks
@st.composite
def catalogs(draw):
    num_steps = draw(st.integers(2, 3))
    sizes = [draw(st.integers(1, 6)) for _ in range(num_steps)]
    n = draw(st.integers(1, 25))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    sids = np.stack([rng.integers(0, v, n) for v in sizes], axis=1)
    formats = {t: draw(st.sampled_from(["auto", "sparse", "dense"])) for t in range(num_steps)}
    eos = draw(st.sampled_from([None, 1]))
    if draw(st.booleans()):
        offsets = [3 + sum(sizes[:t]) for t in range(num_steps)]  # TIGER: disjoint ranges
        sid_map = hf.SidMap.from_offsets(offsets, eos_token_id=eos)
    else:  # a shuffled explicit table, tokens shared across steps
        perm = rng.permutation(max(sizes) + 4) + 2
        rows = [[int(perm[c]), t, c] for t in range(num_steps) for c in range(sizes[t])]
        sid_map = hf.SidMap.from_table(rows, eos_token_id=eos)
    return sids, sizes, formats, sid_map, seed


def _random_prefixes(rng, sids, token_table, step: int, rows: int, vocab: int) -> np.ndarray:
    """[rows, step] generated tokens: mostly catalog prefixes, some with one junk token."""
    picks = sids[rng.integers(0, sids.shape[0], rows)]
    out = np.array([[token_table[t][sid[t]] for t in range(step)] for sid in picks], dtype=np.int64)
    out = out.reshape(rows, step)
    if step:
        junk = rng.random(rows) < 0.3
        out[junk, rng.integers(0, step, rows)[junk]] = rng.integers(0, vocab, int(junk.sum()))
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=catalogs(),
    prompt=st.integers(0, 3),
    explicit=st.booleans(),
    table_bytes=st.sampled_from([0, 200, 10**6]),  # every layout mix (see vocab_masks.py)
)
def test_processor_masks_equal_the_dict_trie(case, prompt: int, explicit: bool, table_bytes: int) -> None:
    sids, sizes, formats, sid_map, seed = case
    rng = np.random.default_rng(seed + 1)
    index = build_index(sids, sizes, step_formats=formats)
    table = sid_map.token_table(sizes)
    vocab = int(max(int(t.max()) for t in table)) + 5
    trie = trie_children(sids, table, sid_map.eos_token_id)
    proc = hf.SidLogitsProcessor(
        index, sid_map, prompt_length=prompt if explicit else None, table_bytes=table_bytes
    )  # table_bytes 0: every sparse step in the slots layout
    last = len(sizes) + (sid_map.eos_token_id is not None)
    for generation in range(2):  # the second generation must be detected as a new one
        rows = int(rng.integers(1, 7))
        width = prompt if explicit else prompt + generation  # a new generation, maybe a new prompt width
        prompt_ids = rng.integers(0, vocab, (rows, width))
        for step in range(last):
            generated = _random_prefixes(rng, sids, table, step, rows, vocab)
            input_ids = torch.as_tensor(np.concatenate([prompt_ids, generated], axis=1))
            scores = torch.randn(rows, vocab)
            out = proc(input_ids, scores)
            for r in range(rows):
                allowed = trie.get(tuple(generated[r].tolist()), set())
                got = set(torch.isfinite(out[r]).nonzero().flatten().tolist())
                assert got == allowed, (generation, step, r)
                assert torch.equal(out[r, sorted(got)], scores[r, sorted(got)])


def test_processor_follows_rows_shuffled_between_calls() -> None:
    sids = np.array([[0, 1, 2], [0, 1, 0], [1, 0, 0], [2, 2, 1], [0, 2, 2]])
    sid_map = hf.SidMap.from_offsets([3, 6, 9])
    proc = hf.SidLogitsProcessor(build_index(sids, [3, 3, 3]), sid_map)
    trie = trie_children(sids, sid_map.token_table([3, 3, 3]), None)
    rng = np.random.default_rng(0)
    seqs = np.full((4, 2), 2)  # [R, prompt]
    for _step in range(3):
        out = proc(torch.as_tensor(seqs), torch.zeros(4, 14))
        nxt = [rng.choice(sorted(trie[tuple(s[2:].tolist())])) for s in seqs]
        seqs = np.concatenate([seqs, np.array(nxt)[:, None]], axis=1)[rng.permutation(4)]  # HF reorders
        assert torch.isfinite(out).any(dim=1).all()
    assert {tuple(s) for s in hf.SidLogitsProcessor(proc.index, sid_map).sids(torch.as_tensor(seqs))} <= {
        tuple(s) for s in sids.tolist()
    }


def test_processor_errors() -> None:
    index = build_index(np.array([[0, 1], [1, 2]]), [2, 3])
    with pytest.raises(InputError, match="spells none"):
        hf.SidLogitsProcessor(index, hf.SidMap.from_table({3: (0, 0), 4: (0, 1), 5: (1, 1)}))
    proc = hf.SidLogitsProcessor(index, hf.SidMap.from_offsets([3, 5]), prompt_length=1)
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        proc(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 6))
    with pytest.raises(InputError, match="past the SID"):
        proc(torch.tensor([[0, 3, 6]]), torch.zeros(1, 9))
    with pytest.raises(InputError, match="prompt_length"):
        proc(torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 9))


def test_import_zerogr_build_does_not_import_transformers() -> None:
    code = (
        "import sys, zerogr_build, zerogr_build.integrations, zerogr_build.integrations.sid_map; "
        "sys.exit('transformers' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("eos", [None, 13])
def test_processor_without_prompt_length_refuses_to_go_past_the_sid(eos) -> None:
    """G13: with prompt_length inferred, the call after the SID's last step (EOS included) of the same
    generation raises instead of silently starting a second SID; a new prompt still starts a new one."""
    sids = np.array([[0, 1, 2], [0, 1, 0], [1, 0, 0], [2, 2, 1]])
    sid_map = hf.SidMap.from_offsets([3, 6, 9], eos_token_id=eos)
    proc = hf.SidLogitsProcessor(build_index(sids, [3, 3, 3]), sid_map)
    trie = trie_children(sids, sid_map.token_table([3, 3, 3]), eos)
    seqs = np.full((2, 2), 2)
    for _step in range(3 + (eos is not None)):
        out = proc(torch.as_tensor(seqs), torch.zeros(2, 14))
        nxt = [min(trie[tuple(s[2:].tolist())]) for s in seqs]
        seqs = np.concatenate([seqs, np.array(nxt)[:, None]], axis=1)
        assert torch.isfinite(out).any(dim=1).all()
    with pytest.raises(InputError, match="went past the SID"):
        proc(torch.as_tensor(seqs), torch.zeros(2, 14))
    other = np.full((2, seqs.shape[1] + 1), 1)  # a new prompt of the length that follows: step 0
    allowed = set(torch.isfinite(proc(torch.as_tensor(other), torch.zeros(2, 14))[0]).nonzero().flatten())
    assert {int(t) for t in allowed} == trie[()]
