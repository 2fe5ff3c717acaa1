"""`zerogr compare --hf-model` inputs past the model's limits are exit 2 with one line naming the file: a
prompt longer than the model's positions leave room for, a token id beyond its vocabulary, a SidMap
integer beyond int64 or spelling tokens the model does not have. Inputs exactly at the limits run."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.bundle import publish_bundle
from zerogr_build.index import build_index
from zerogr_build.integrations.sid_map import SidMap

from .cli_runs import invoke, one_error_line
from .conftest import HF_SID_OFFSET, HF_VOCAB

SIZES = (4, 4, 2)
POSITIONS = 64  # conftest's tiny gpt2 (n_positions) and bart (max_position_embeddings)
OFFSETS = [HF_SID_OFFSET, HF_SID_OFFSET + 4, HF_SID_OFFSET + 8]


@pytest.fixture
def gate(tmp_path, tiny_hf_models):
    """(run(kind, requests rows, sid map dict) -> CLI result, tmp_path): a 20-SID bundle, saved models."""
    rng = np.random.default_rng(5)
    codes = np.array(np.unravel_index(rng.choice(np.prod(SIZES), 20, replace=False), SIZES)).T
    bundle = publish_bundle(build_index(codes, SIZES), pa.array(100 + np.arange(20)), tmp_path / "b").path
    for kind in ("gpt2", "bart"):
        tiny_hf_models[kind].save_pretrained(tmp_path / kind)

    def run(kind: str, rows: list[list[int]], sid_map: dict | None = None):
        (tmp_path / "sid_map.json").write_text(json.dumps(sid_map or {"offsets": OFFSETS, "eos_token_id": 1}))
        pq.write_table(pa.table({"input_ids": rows}), tmp_path / "r.parquet")
        return invoke(
            "compare", bundle, "--hf-model", tmp_path / kind, "--sid-map", tmp_path / "sid_map.json",
            "--requests", tmp_path / "r.parquet", "--k", 1, "--beam-width", 2, "--min-overlap", 0,
        )  # fmt: skip

    return run, tmp_path


def _prompt(n: int) -> list[int]:
    return [int(t) for t in np.arange(n) % (HF_VOCAB - 13) + 13]


@pytest.mark.parametrize(
    ("kind", "sid_map", "limit"),
    [
        ("gpt2", {"offsets": OFFSETS, "eos_token_id": 1}, POSITIONS - 3),  # 2 SID tokens and EOS fed back
        ("gpt2", {"offsets": OFFSETS}, POSITIONS - 2),
        ("bart", {"offsets": OFFSETS, "eos_token_id": 1}, POSITIONS),  # the encoder takes the prompt alone
    ],
)
def test_a_prompt_longer_than_the_model_takes_is_exit_2_naming_row_and_limit(gate, kind, sid_map, limit):
    run, tmp_path = gate
    done = run(kind, [_prompt(5), _prompt(limit)], sid_map)
    assert done.exit_code == 0, done.output
    line = one_error_line(run(kind, [_prompt(5), _prompt(limit + 1)], sid_map), 2)
    assert line == (
        f"error: {tmp_path / 'r.parquet'}: column 'input_ids' row 1: {limit + 1} tokens, more than the model "
        f"takes ({limit} at most)"
    )


def test_a_token_id_beyond_the_vocabulary_is_exit_2(gate):
    run, tmp_path = gate
    for bad in (HF_VOCAB, 2**63 - 1):
        line = one_error_line(run("gpt2", [[13, 14], [13, bad]]), 2)
        assert f"{tmp_path / 'r.parquet'}: column 'input_ids' row 1: token id {bad} outside" in line


@pytest.mark.parametrize(
    ("sid_map", "words"),
    [
        ({"offsets": [3, 19, 10**30]}, "offsets[2] must be a non-negative integer up to 2**63 - 1"),
        ({"offsets": [3, 7, 2**63 - 2]}, "offsets[2] 9223372036854775806 spells codes 0..1 as tokens up to"),
        ({"offsets": [3, 7, 2**64]}, "offsets[2] must be a non-negative integer"),
        (
            {"offsets": [3, 7, HF_VOCAB - 1]},
            f"offsets[2] {HF_VOCAB - 1} spells codes 0..1 as tokens up to 40",
        ),
        ({"offsets": OFFSETS, "eos_token_id": HF_VOCAB}, f"eos_token_id {HF_VOCAB} is beyond the model's"),
        ({"offsets": OFFSETS, "eos_token_id": 2**63}, "eos_token_id must be a non-negative integer"),
        ({"table": [[3, 0, 0], [2**63, 1, 0]]}, "table row 1 must be a non-negative integer"),
    ],
)
def test_sid_map_integers_past_int64_or_the_vocabulary_are_exit_2_naming_file_and_key(gate, sid_map, words):
    run, tmp_path = gate
    line = one_error_line(run("gpt2", [[13, 14]], sid_map), 2)
    assert line.startswith(f"error: {tmp_path / 'sid_map.json'}: ") and words in line


def test_a_sid_map_table_token_beyond_the_vocabulary_names_the_step():
    index = build_index(np.array([[0, 1], [1, 0]]), [2, 2])
    sid_map = SidMap.from_table([[3, 0, 0], [4, 0, 1], [5, 1, 0], [99, 1, 1]])
    with pytest.raises(Exception, match=r"table spells a code of step 1 as token 99, beyond"):
        sid_map.check_vocabulary(index.codebook_sizes, HF_VOCAB)
    sid_map.check_vocabulary(index.codebook_sizes, 100)
