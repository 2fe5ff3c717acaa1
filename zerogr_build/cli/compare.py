"""`zerogr compare`: filter-first vs score-first (and unconstrained) top-K lists with the user's model, and
the quality gate (--min-overlap, --max-recall-gap, --record)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..base.errors import InputError
from ._errors import cli_errors, warnings_on_stderr
from ._options import AvailableOpt, BundleArg, ConfigOpt, JsonOpt, bundle_path
from ._progress import progress_for
from ._render import stdout_console

GATE_FAILED_EXIT = 10
"""Exit code of `zerogr compare --min-overlap ...` when the gate fails (0 passes, 2 bad input)."""


def compare(
    bundle: BundleArg = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Your model as module:function -> (weights, step_fn); the contract is above.",
            show_default=False,
        ),
    ] = None,
    hf_model: Annotated[
        str | None,
        typer.Option(
            "--hf-model",
            help="A Hugging Face model saved with save_pretrained (a local dir; nothing is downloaded). "
            "Needs --sid-map; --requests then holds token ids.",
            show_default=False,
        ),
    ] = None,
    sid_map: Annotated[
        str | None,
        typer.Option(
            "--sid-map",
            help='JSON: how the model spells SIDs, {"offsets": [o_0, ..., o_L-1], "eos_token_id": null} '
            '(token = o_t + code) or {"table": [[token, step, code], ...]} (SidMap.save writes one).',
            show_default=False,
        ),
    ] = None,
    requests: Annotated[
        str,
        typer.Option(
            "--requests",
            help="Parquet. With --model: a request_id column (+ optional target_item for Recall/NDCG). "
            "With --hf-model: an input_ids list column (+ optional attention_mask, target_item).",
        ),
    ] = ...,  # type: ignore[assignment]
    beam_width: Annotated[
        int | None,
        typer.Option(
            "--beam-width", help="Beams per request M, >= every K [default: max K]", show_default=False
        ),
    ] = None,
    k: Annotated[str, typer.Option("--k", help="Cutoffs K (each <= the beam width)")] = "1,5,10,20",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests per search")] = 64,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda:N")] = "cpu",
    request_column: Annotated[str, typer.Option("--request-column", help="With --model")] = "request_id",
    target_column: Annotated[str, typer.Option("--target-column")] = "target_item",
    min_overlap: Annotated[
        float | None,
        typer.Option(
            "--min-overlap",
            help="Quality gate: pass only if overlap@K >= this at every K (e.g. 0.995). Exit 10 if not.",
            show_default=False,
        ),
    ] = None,
    max_recall_gap: Annotated[
        float | None,
        typer.Option(
            "--max-recall-gap",
            help="Quality gate: also fail if Recall@K(score-first) - Recall@K(filter-first) exceeds this at "
            "any K (needs target_item).",
            show_default=False,
        ),
    ] = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="Write the gate's decision (order filter_first or score_first) into the bundle version as "
            "quality/<model tag>.json; Decoder(order='auto') follows it. Needs --min-overlap.",
        ),
    ] = False,
    model_tag: Annotated[
        str | None,
        typer.Option(
            "--model-tag",
            help="The model version the record is filed under [default: the bundle's --model-version; "
            "with --hf-model and no tag, the model's hash]",
            show_default=False,
        ),
    ] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    available: AvailableOpt = None,
) -> None:
    """Decode the requests filter-first, score-first and unconstrained with your model and compare the top-K
    lists: overlap@K, Recall@K, NDCG@K, invalid probability mass per step. With --min-overlap it is a quality
    gate, and with --record its decision goes into the bundle (docs/quality-gate.md).

    Exit codes: 0 ok (and the gate passed); 10 the gate failed (with --record, score_first was recorded);
    2 bad input or usage; 1 anything else.

    \b
    The model, either way:
      --hf-model DIR --sid-map FILE   a saved transformers model with a language-model head, decoded with
                                      its own KV cache; requests hold input_ids.
      --model module:function         any model; the module is imported from the current directory:
        def function(bundle, request_ids) -> (weights, step_fn)
          bundle       the opened zerogr_build.Bundle under test
          request_ids  one batch of values of the request column (file order)
          weights      L per-step output layers, weights[t] of shape [V_t, d] (V_t = bundle codebook size
                       of step t): a torch tensor / numpy array, a (weight, bias[V_t]) pair, a
                       {"weight", "bias"} dict or an nn.Linear; fp32, fp16 or bf16, the same d every step
          step_fn(step, prefixes, batch) -> hidden [R, d]
                       prefixes: LongTensor [R, step], each beam's codes so far; batch: LongTensor [R],
                       the position in request_ids of each beam's request. Must be deterministic.
        It is called once per batch of requests; logits of step t are hidden @ weight.T + bias.

    --available decodes every order under that availability mask (invalid mass is still measured against
    the catalog)."""
    with cli_errors(), warnings_on_stderr():
        if (model is None) == (hf_model is None):
            raise InputError("give exactly one of --model module:function and --hf-model DIR")
        if (sid_map is None) != (hf_model is None):
            raise InputError("--hf-model and --sid-map go together")
        if hf_model is not None and request_column != "request_id":
            raise InputError(
                "--request-column applies to --model; with --hf-model each row of --requests is a request"
            )
        if min_overlap is None and (record or max_recall_gap is not None):
            raise InputError("--record and --max-recall-gap need --min-overlap (the gate's threshold)")
        if model_tag is not None and not model_tag.strip():
            raise InputError("--model-tag must not be empty")
        # Imported when the command runs: compare decodes with torch, `zerogr --help` should not load it.
        from ..base.device import check_device
        from ..bundle import load_manifest, resolve_bundle
        from ..compare import parse_ks, run_compare
        from ..compare.gate import GateThresholds, run_gate
        from ..compare.inputs import beam_width_for
        from ..compare.tables import report_tables

        thresholds = None if min_overlap is None else GateThresholds(min_overlap, max_recall_gap)
        ks = parse_ks(k)
        beam_width_for(ks, beam_width)
        version_dir = resolve_bundle(bundle_path(bundle, config))  # measured and recorded: one version
        bundle_tag = load_manifest(version_dir)["model_version"]
        if record and model is not None and model_tag is None and not bundle_tag:
            raise InputError(
                f"--record: {version_dir} has no model version (zerogr build --model-version); "
                "name the model with --model-tag"
            )
        if max_recall_gap is not None:
            _need_column(requests, target_column, "--max-recall-gap")
        check_device(device)
        with progress_for(json_out) as progress:
            if hf_model is not None:
                from ..integrations.hf.compare import run_hf_compare

                report = run_hf_compare(
                    version_dir, hf_model, sid_map, requests, beam_width=beam_width, ks=ks,
                    batch_size=batch_size, device=device, target_column=target_column, progress=progress,
                    available=available,
                )  # fmt: skip
            else:
                report = run_compare(
                    version_dir, model, requests, beam_width=beam_width, ks=ks, batch_size=batch_size,
                    device=device, request_column=request_column, target_column=target_column,
                    progress=progress, available=available,
                )  # fmt: skip
        gate = (
            None
            if thresholds is None
            else run_gate(report, thresholds, version_dir, record=record, model_tag=model_tag)
        )
        decision = None if gate is None else gate.decision
        recorded = None if gate is None else gate.recorded
        if json_out:
            out = report.to_dict()
            if gate is not None:
                out["gate"] = gate.to_dict()
            sys.stdout.write(json.dumps(out, default=str) + "\n")
        else:
            console = stdout_console()
            title = f"{report.requests} requests, beam {report.beam_width}: filter-first vs score-first"
            for renderable in report_tables(report, title):
                console.print(renderable)
            if decision is not None:
                console.print(_gate_line(decision, thresholds), markup=False)
            if recorded is not None:
                console.print(
                    f"recorded order {decision.order} for model {recorded['model_version']} in "
                    f"{version_dir}/{recorded['file']}",
                    markup=False,
                )
        if decision is not None and not decision.passed:
            raise typer.Exit(GATE_FAILED_EXIT)


def _gate_line(decision, thresholds) -> str:
    if decision.passed:
        line = (
            f"quality gate PASSED: worst overlap@{decision.worst_overlap_k} = "
            f"{100 * decision.worst_overlap:.2f}% >= {100 * thresholds.min_overlap:.2f}%"
        )
        if decision.recall_gap is not None:
            line += f"; recall gap {decision.recall_gap:.4f} <= {thresholds.max_recall_gap}"
        return line + "; order filter_first"
    return f"quality gate FAILED: {'; '.join(decision.reasons)}; order score_first"


def _need_column(path: str, column: str, option: str) -> None:
    """InputError unless the Parquet file at `path` has `column` (read errors are left to the reader)."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - the requests reader reports unreadable files with its own message
        return
    if column not in names:
        raise InputError(f"{option} needs ground truth: {path} has no {column!r} column")
