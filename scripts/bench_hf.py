"""Hugging Face generate benchmark: SidLogitsProcessor against prefix_allowed_tokens_fn over a dict trie.

    python scripts/bench_hf.py           # CPU: 100k items, L=3, V=256, tiny T5, 16 requests x 20 beams
    python scripts/bench_hf.py --model gpt2 --items 1000000

Same model, catalog, prompts and beam settings in every row (one run, one table):
  prefix_allowed_tokens_fn   the usual research code: a Python dict trie of the catalog's token sequences and
                             HF's PrefixConstrainedLogitsProcessor (one Python call per beam per step)
  SidLogitsProcessor         zerogr's processor: the bundle's step tables, all beams at once, vectorised
  no constraint              plain HF beam search (reference; SIDs may be invalid)
  zg_hf.generate (order)     the zerogr Decoder over the same model and KV cache (SidGenerator built once)
Torch runs on 1 CPU thread by default (--threads 0: torch's default): the constraint work is many small
tensor ops, where intra-op threads add only synchronisation, and on a shared machine they time the other
tenants' load. Both paths always run with the same setting.
"constraint ms/step" is the time inside the constraint processor (timed by a wrapper around it, the same for
both), per generation step; "generate ms" is the whole call, median over repeats after one warm-up.
Target: the processor's constraint time >= 20x lower than prefix_allowed_tokens_fn's.
The catalog comes from zerogr_build.synthetic's skewed generator (the one scripts/make_catalog.py writes).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import transformers
from transformers import LogitsProcessor, LogitsProcessorList, PrefixConstrainedLogitsProcessor

from zerogr_build.index import build_index
from zerogr_build.integrations import hf as zg_hf
from zerogr_build.synthetic import generate_sids

SPECIAL = 3  # 0 pad, 1 eos, 2 bos / decoder start; SID tokens follow


class Timed(LogitsProcessor):
    """Wraps one logits processor and adds up the wall time of its calls."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, input_ids, scores):
        start = time.perf_counter()
        out = self.inner(input_ids, scores)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def dict_trie(token_sids: np.ndarray) -> dict:
    """Nested {token: {...}} of every catalog token sequence (what research code builds)."""
    root: dict = {}
    for seq in token_sids.tolist():
        node = root
        for tok in seq:
            node = node.setdefault(tok, {})
    return root


def trie_prefix_fn(trie: dict, prompt_length: int, fallback: int):
    """prefix_allowed_tokens_fn(batch_id, sent): children of the generated suffix in the trie."""

    def allowed(_batch_id: int, sent: torch.Tensor) -> list[int]:
        node = trie
        for tok in sent.tolist()[prompt_length:]:
            node = node.get(tok)
            if node is None:
                return [fallback]
        return list(node) or [fallback]

    return allowed


def make_model(kind: str, vocab: int, dim: int, seed: int):
    torch.manual_seed(seed)
    special = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    if kind == "t5":
        config = transformers.T5Config(
            vocab_size=vocab, d_model=dim, d_kv=dim // 4, d_ff=2 * dim, num_layers=2, num_heads=4,
            decoder_start_token_id=2, **special,
        )  # fmt: skip
        return transformers.T5ForConditionalGeneration(config).eval()
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=dim, n_layer=2, n_head=4, n_positions=64, **special
    )
    return transformers.GPT2LMHeadModel(config).eval()


def timed_runs(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--codebook", type=int, default=256)
    parser.add_argument("--model", choices=["t5", "gpt2"], default="t5")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--beams", type=int, default=20)
    parser.add_argument("--prompt", type=int, default=20, help="history tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)

    sizes = [args.codebook] * args.steps
    sids = generate_sids(args.items, sizes, seed=args.seed, mode="skewed")
    start = time.perf_counter()
    index = build_index(sids, sizes)
    index_s = time.perf_counter() - start
    sid_map = zg_hf.SidMap.from_offsets([SPECIAL + t * args.codebook for t in range(args.steps)])
    token_sids = np.asarray(sids, dtype=np.int64) + SPECIAL + args.codebook * np.arange(args.steps)
    start = time.perf_counter()
    trie = dict_trie(token_sids)
    trie_s = time.perf_counter() - start

    vocab = SPECIAL + args.steps * args.codebook
    model = make_model(args.model, vocab, args.dim, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    history = torch.randint(SPECIAL, vocab, (args.batch, args.prompt), generator=g)
    prompt_length = 1 if model.config.is_encoder_decoder else args.prompt
    m, steps = args.beams, args.steps

    def hf_generate(processor):
        procs = LogitsProcessorList([processor]) if processor is not None else None
        return model.generate(
            history, num_beams=m, num_return_sequences=m, max_new_tokens=steps, min_new_tokens=steps,
            do_sample=False, logits_processor=procs, early_stopping=False,
        )  # fmt: skip

    trie_proc = Timed(PrefixConstrainedLogitsProcessor(trie_prefix_fn(trie, prompt_length, 0), m))
    zg_proc = Timed(zg_hf.SidLogitsProcessor(index, sid_map))
    rows = []
    outputs = {}
    for name, proc in (("prefix_allowed_tokens_fn (dict trie)", trie_proc), ("SidLogitsProcessor", zg_proc)):
        outputs[name] = hf_generate(proc)  # warm-up (the processor uploads its tables on its first call)
        proc.seconds, proc.calls = 0.0, 0
        total = timed_runs(lambda proc=proc: hf_generate(proc), args.repeats)
        rows.append((name, 1e3 * proc.seconds / proc.calls, 1e3 * total))
    rows.append(
        ("no constraint (reference)", None, 1e3 * timed_runs(lambda: hf_generate(None), args.repeats))
    )
    gen = zg_hf.SidGenerator(model, index, sid_map)
    for order in ("filter_first", "score_first"):
        seconds = timed_runs(
            lambda order=order: gen.generate(history, beam_width=m, order=order), args.repeats
        )
        rows.append((f"zg_hf.generate ({order})", None, 1e3 * seconds))

    a, b = (outputs[k][:, -steps:] for k in outputs)
    same = all(
        {tuple(r) for r in a[i : i + m].tolist()} == {tuple(r) for r in b[i : i + m].tolist()}
        for i in range(0, a.shape[0], m)
    )
    catalog = {tuple(r) for r in token_sids.tolist()}
    valid = all(tuple(r) in catalog for r in b.tolist())

    print(
        f"catalog: {args.items:,} items, L={steps}, V={args.codebook} (skewed); model: {args.model} "
        f"d={args.dim}, vocab {vocab}; {args.batch} requests x {m} beams; "
        f"CPU, {torch.get_num_threads()} torch threads"
    )
    print(f"build: zerogr index {index_s:.2f} s, dict trie {trie_s:.2f} s")
    print(f"{'path':40s} {'constraint ms/step':>20s} {'generate ms':>12s}")
    for name, per_step, total in rows:
        per = f"{per_step:20.3f}" if per_step is not None else f"{'-':>20s}"
        print(f"{name:40s} {per} {total:12.1f}")
    ratio = rows[0][1] / rows[1][1]
    print(f"constraint time: SidLogitsProcessor {ratio:.1f}x lower than the dict trie's (target >= 20x)")
    print(f"same beams from both constrained paths: {same}; every processor SID in the catalog: {valid}")
    return 0 if ratio >= 20 and same and valid else 1


if __name__ == "__main__":
    raise SystemExit(main())
