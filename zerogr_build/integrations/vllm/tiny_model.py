"""A tiny Llama, a word-level tokenizer and SID catalogs, made on disk (nothing downloaded): for the vLLM
integration's tests and scripts/bench_vllm.py, not for production.

The vocabulary: 0 <pad>, 1 <s>, 2 </s>, 3 <unk>, then PROMPT_WORDS prompt words "w0".."w{n-1}", then the SID
tokens: code c of step t is token SID_OFFSETS[t] + c (SidMap.from_offsets), then spare tokens up to VOCAB.
Head dimension 64 (vLLM's CPU attention refuses 16).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...bundle import publish_bundle
from ...index import build_index
from ..sid_map import SidMap

EOS = 2
PROMPT_WORDS = 28
SIZES = (8, 8, 8)  # codebook sizes: 3-token SIDs
SID_OFFSETS = (32, 40, 48)
VOCAB = 64


def make_model(path: Path, seed: int = 0, init_std: float = 0.5) -> Path:
    """A 2-layer Llama (hidden 128, 2 heads of 64) with random weights and a word-level tokenizer, saved
    with save_pretrained in fp32. init_std: the weights' init scale (large: well separated logits)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(PROMPT_WORDS)]
    words += [f"s{t}_{c}" for t, v in enumerate(SIZES) for c in range(v)]
    words += [f"x{i}" for i in range(VOCAB - len(words))]
    assert [words.index(f"s{t}_0") for t in range(len(SIZES))] == list(SID_OFFSETS)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(path)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False,
        initializer_range=init_std, torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


def sid_map(eos: bool = True) -> SidMap:
    return SidMap.from_offsets(list(SID_OFFSETS), eos_token_id=EOS if eos else None)


def catalog_sids(n: int, seed: int) -> np.ndarray:
    """n distinct SIDs int64 [n, 3] (codes), sorted."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(int(np.prod(SIZES)), size=n, replace=False)
    return np.stack(np.unravel_index(np.sort(flat), SIZES), axis=1).astype(np.int64)


def publish(out: Path, sids: np.ndarray, ids: np.ndarray | None = None) -> Path:
    """Publish sids (item ids 1000 + row unless given) as the next version of OUT dir `out`; its path."""
    ids = 1000 + np.arange(sids.shape[0]) if ids is None else ids
    index = build_index(sids, list(SIZES))
    return publish_bundle(index, pa.array(np.asarray(ids, dtype=np.int64)), out).path


def write_sets(path: Path, sets: dict[str, list[int]]) -> Path:
    names = [name for name, members in sets.items() for _ in members]
    items = [int(i) for members in sets.values() for i in members]
    pq.write_table(pa.table({"set": names, "item_id": pa.array(items, pa.int64())}), path)
    return path


def write_available(path: Path, ids) -> Path:
    pq.write_table(pa.table({"item_id": pa.array([int(i) for i in ids], pa.int64())}), path)
    return path


def write_registry(path: Path, catalogs: dict[str, dict], **top) -> Path:
    """A catalog registry file (registry.py): one [catalogs.NAME] table per entry of `catalogs` (keys
    bundle, sid_map, item_sets, availability, follow), top-level keys from `top` (allow_paths_under,
    poll_seconds, limits = {...})."""
    lines = [f"{key} = {_toml(v)}" for key, v in top.items()]
    for name, entry in catalogs.items():
        lines += ["", f"[catalogs.{name}]"] + [f"{key} = {_toml(v)}" for key, v in entry.items()]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value) -> str:
    """A TOML value: inline table, array, bool / number, or a string (paths too; JSON escapes are TOML's)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return json.dumps(str(value))


def sid_codes(token_ids) -> tuple[int, ...] | None:
    """The codes of the first 3 generated tokens, None when one is not a SID token of its step."""
    codes = []
    for t, tok in enumerate(list(token_ids)[: len(SIZES)]):
        code = int(tok) - SID_OFFSETS[t]
        if not 0 <= code < SIZES[t]:
            return None
        codes.append(code)
    return tuple(codes) if len(codes) == len(SIZES) else None


def prompt(rng: np.random.Generator, length: int = 6) -> list[int]:
    """A prompt of token ids: <s> then random prompt words."""
    return [1] + (4 + rng.integers(0, PROMPT_WORDS, size=length)).tolist()
