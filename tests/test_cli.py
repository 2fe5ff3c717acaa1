"""The `zerogr` CLI end to end (build -> inspect -> verify), exit codes, output contracts; config loading."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zerogr_build.base.errors import InputError
from zerogr_build.cli import app
from zerogr_build.config import KNOWN_TABLES, BuildSettings, load_settings
from zerogr_build.testing import stderr_lines as nonblank_stderr_lines

from .cli_runs import run_rebuild

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def make_catalog(path: Path, n: int = 400, length: int = 3, vocab: int = 12, seed: int = 0) -> np.ndarray:
    """Small catalog with some items sharing a SID (vocab**length is close to n)."""
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, vocab, size=(n, length))
    flat = pa.array(sids.reshape(-1), pa.uint16())
    col = pa.ListArray.from_arrays(pa.array(np.arange(0, n * length + 1, length, dtype=np.int32)), flat)
    pq.write_table(pa.table({"item_id": pa.array(np.arange(n) * 3 + 1, pa.int64()), "sid": col}), path)
    return sids


def invoke(*args: str):
    return runner.invoke(app, list(args))


def build(tmp_path: Path, out: Path, *args: str):
    """`zerogr build` of tmp_path/cat.parquet (V = 12 per step) into `out`; asserts success."""
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "-o", str(out), "--codebook-sizes", "12,12,12", *args
    )
    assert res.exit_code == 0, res.output
    return res


def stderr_lines(result) -> list[str]:
    return nonblank_stderr_lines(result.stderr)


# --------------------------------------------------------------------------------------- end to end


def test_build_inspect_verify_end_to_end(tmp_path):
    sids = make_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "bundles"
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "--out", str(out), "--codebook-sizes", "12,12,12", "--json"
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    for key in (
        "bundle",
        "version",
        "items",
        "distinct_sids",
        "collisions",
        "index_bytes",
        "seconds",
        "steps",
    ):
        assert key in summary
    distinct = len(np.unique(sids, axis=0))
    assert summary["items"] == 400 and summary["distinct_sids"] == distinct
    assert summary["collisions"] == 400 - distinct > 0
    assert summary["version"] == 1 and Path(summary["bundle"]) == out / "v000001"
    assert [s["step"] for s in summary["steps"]] == [0, 1, 2]
    assert not summary["codebook_inferred"]
    assert (out / "LATEST").read_text().strip() == "v000001"

    res = invoke("inspect", str(out), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["version"] == 1 and report["items"] == 400 and report["distinct_sids"] == distinct
    assert report["index_bytes"] == summary["index_bytes"]
    assert report["static_bytes"]["total"] > 0 and report["ratio_to_static"] > 0
    assert [s["nnz"] for s in report["steps"]] == [s["nnz"] for s in summary["steps"]]

    res = invoke("inspect", str(out))
    assert res.exit_code == 0 and "STATIC" in res.stdout and "max_slots" in res.stdout

    res = invoke("verify", str(out), "--catalog", str(tmp_path / "cat.parquet"))
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("OK ")

    # a second build publishes the next version; --keep 1 prunes the first
    res = build(tmp_path, out, "-q", "--keep", "1")
    assert res.stdout.strip() == str(out / "v000002")
    assert not (out / "v000001").exists()


def test_build_no_promote_then_promote(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "bundles"
    assert json.loads(build(tmp_path, out, "--json").stdout)["promoted"] is True
    summary = json.loads(build(tmp_path, out, "--no-promote", "--json").stdout)
    assert summary["promoted"] is False and summary["version"] == 2
    assert (out / "LATEST").read_text() == "v000001\n"
    config = tmp_path / "c.toml"
    config.write_text("[build]\npromote = false\n")
    assert json.loads(build(tmp_path, out, "-c", str(config), "--json").stdout)["promoted"] is False
    assert json.loads(build(tmp_path, out, "-c", str(config), "--promote", "--json").stdout)["promoted"]
    assert (out / "LATEST").read_text() == "v000004\n"

    res = invoke("promote", str(out / "v000002"))
    assert res.exit_code == 0, res.output
    assert res.stdout == f"{out / 'LATEST'} -> v000002\n"
    assert (out / "LATEST").read_text() == "v000002\n"
    for not_a_version in (out, tmp_path / "nothing", tmp_path / "cat.parquet"):
        res = invoke("promote", str(not_a_version))
        assert res.exit_code == 2 and len(stderr_lines(res)) == 1 and "not a version dir" in res.stderr
    (out / "v000003" / "leaves.offsets.npy").unlink()
    res = invoke("promote", str(out / "v000003"))
    assert res.exit_code == 1 and "leaves.offsets.npy" in res.stderr
    assert (out / "LATEST").read_text() == "v000002\n"


def test_manifest_records_settings_catalog_and_model_version(tmp_path):
    sids = make_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "b"
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "--out", str(out), "--codebook-sizes", "16,16,16",
        "--model-version", "ckpt-42", "--step-formats", "0=dense,2=dense", "-q",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "v000001" / "manifest.json").read_text())
    assert manifest["model_version"] == "ckpt-42"
    assert manifest["codebook_sizes"] == [16, 16, 16]
    assert manifest["catalog"]["rows"] == 400 and manifest["catalog"]["fingerprint"].startswith("sha256:")
    assert manifest["settings"]["step_formats"] == "0=dense,2=dense"
    # Step 1 is not named, so auto decides it: dense only when >= 90% of its [rows, V] table is valid. Here
    # 12 of 16 tokens occur, so it cannot be, while the forced steps 0 and 2 would be sparse under auto.
    rows, nnz = len(np.unique(sids[:, :1], axis=0)), len(np.unique(sids[:, :2], axis=0))
    assert nnz / (rows * 16) < BuildSettings().dense_min_share
    assert [s["format"] for s in manifest["steps"]] == ["dense", "sparse", "dense"]


def test_missing_codebook_sizes_exit_2_and_say_what_to_pass(tmp_path):
    """a forgotten --codebook-sizes cannot slip through a cron job: exit 2, one line, nothing
    published, and the line names both ways out."""
    make_catalog(tmp_path / "cat.parquet")
    res = invoke("build", str(tmp_path / "cat.parquet"), "--out", str(tmp_path / "b"), "--json")
    assert res.exit_code == 2, res.output
    lines = stderr_lines(res)
    assert len(lines) == 1 and "--codebook-sizes" in lines[0] and "--infer-codebook-sizes" in lines[0]
    assert 'codebook_sizes = "infer"' in lines[0]
    assert res.stdout == "" and not (tmp_path / "b").exists()


def test_inferred_codebook_sizes_are_an_explicit_choice(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    res = invoke(
        "build",
        str(tmp_path / "cat.parquet"),
        "--out",
        str(tmp_path / "b"),
        "--json",
        "--infer-codebook-sizes",
    )
    assert res.exit_code == 0, res.output
    assert "WARNING" in res.stderr and "12,12,12" in res.stderr
    summary = json.loads(res.stdout)
    assert summary["codebook_inferred"] is True and summary["codebook_sizes"] == [12, 12, 12]
    # interactive use: the summary itself shows the sizes it inferred
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "--out", str(tmp_path / "b"), "--infer-codebook-sizes"
    )
    assert res.exit_code == 0, res.output
    assert "codebook sizes inferred from the data: 12,12,12" in res.stdout
    # ... and a build with sizes given says nothing about inference
    assert "codebook sizes inferred" not in build(tmp_path, tmp_path / "b").stdout


def test_infer_codebook_sizes_from_the_config(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    config = tmp_path / "z.toml"
    config.write_text(f'[build]\nout = "{tmp_path / "b"}"\ncodebook_sizes = "infer"\n')
    res = invoke("build", str(tmp_path / "cat.parquet"), "--config", str(config), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["codebook_sizes"] == [12, 12, 12]
    # the command line's sizes beat the config's "infer"
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "-c", str(config), "--codebook-sizes", "16,16,16", "--json"
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["codebook_sizes"] == [16, 16, 16]
    config.write_text('[build]\ncodebook_sizes = "guess"\n')
    res = invoke("build", str(tmp_path / "cat.parquet"), "--config", str(config))
    assert res.exit_code == 2 and '"infer"' in res.stderr


def test_codebook_sizes_and_infer_are_exclusive(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "--out", str(tmp_path / "b"), "--codebook-sizes", "12,12,12",
        "--infer-codebook-sizes",
    )  # fmt: skip
    assert res.exit_code == 2 and "mutually exclusive" in res.stderr
    assert not (tmp_path / "b").exists()


def test_build_bundle_is_a_library_call(tmp_path):
    from zerogr_build.bundle import open_bundle
    from zerogr_build.pipeline import CodebookInferredWarning, build_bundle

    make_catalog(tmp_path / "cat.parquet")
    with pytest.raises(InputError, match="codebook sizes not given"):
        build_bundle(str(tmp_path / "cat.parquet"), BuildSettings(out=str(tmp_path / "b")))
    with pytest.warns(CodebookInferredWarning, match="12,12,12"):
        summary = build_bundle(
            str(tmp_path / "cat.parquet"), BuildSettings(out=str(tmp_path / "b"), codebook_sizes="infer")
        )
    bundle = open_bundle(tmp_path / "b")
    assert summary["bundle"] == str(bundle.path) and summary["version"] == bundle.version == 1
    assert summary["items"] == bundle.index.num_items == 400 and summary["codebook_inferred"]


def test_quiet_prints_only_the_bundle_path(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    res = build(tmp_path, tmp_path / "b", "-q")
    assert res.stdout == f"{tmp_path / 'b' / 'v000001'}\n"
    assert stderr_lines(res) == []  # (a cold numba cache's one compile notice aside)


def test_progress_goes_to_stderr_not_stdout(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    res = build(tmp_path, tmp_path / "b", "--json")
    json.loads(res.stdout)  # stdout is exactly one JSON object
    assert "read" in res.stderr and "write" in res.stderr


def test_separate_sid_columns_and_config_file(tmp_path):
    sids = np.random.default_rng(1).integers(0, 9, size=(100, 2))
    table = pa.table({"pid": [f"p{i}" for i in range(100)], "l0": sids[:, 0], "l1": sids[:, 1]})
    pq.write_table(table, tmp_path / "cat.parquet")
    config = tmp_path / "z.toml"
    config.write_text(
        f'[build]\nout = "{tmp_path / "from-config"}"\nsid_columns = ["l0", "l1"]\nitem_column = "pid"\n'
        "codebook_sizes = [9, 9]\n"
    )
    res = invoke("build", str(tmp_path / "cat.parquet"), "--config", str(config), "-q")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(tmp_path / "from-config" / "v000001")
    # BUNDLE defaults to the configured OUT
    res = invoke("verify", "--config", str(config), "--catalog", str(tmp_path / "cat.parquet"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True
    res = invoke("inspect", "--config", str(config), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["items"] == 100


# -------------------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", r"no such file or directory"),
        ("negative", r"column 'sid', row 2 \(item id 3\): token -1 at step 1 is negative"),
        ("duplicate", r"column 'item_id', row 2 \(item id 2\): duplicate item id"),
        ("garbage", r"not a readable Parquet file"),
        ("codebooks", r"2 codebook sizes given but column 'sid' holds SIDs of 3 tokens"),
        ("formats", r"--step-formats: step 7 out of range"),
        ("config", r"unknown setting 'colour'"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_publishes_nothing(tmp_path, case, message):
    import re

    path = tmp_path / "cat.parquet"
    args = ["--codebook-sizes", "12,12,12"]
    if case == "negative":
        pq.write_table(pa.table({"item_id": [1, 2, 3], "sid": [[1, 2, 3], [3, 4, 5], [5, -1, 0]]}), path)
        args = ["--infer-codebook-sizes"]
    elif case == "duplicate":
        pq.write_table(pa.table({"item_id": [1, 2, 2], "sid": [[1, 2, 3], [3, 4, 5], [5, 1, 0]]}), path)
    elif case == "garbage":
        path.write_bytes(b"definitely not parquet")
    elif case in ("codebooks", "formats", "config"):
        make_catalog(path)
        if case == "codebooks":
            args = ["--codebook-sizes", "12,12"]
        elif case == "formats":
            args += ["--step-formats", "7=dense"]
        else:
            (tmp_path / "c.toml").write_text("[build]\ncolour = 'blue'\n")
            args += ["--config", str(tmp_path / "c.toml")]
    out = tmp_path / "b"
    res = invoke("build", str(path), "--out", str(out), *args)
    assert res.exit_code == 2, res.output
    lines = stderr_lines(res)
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and re.search(message, lines[0]), lines[0]
    assert "Traceback" not in res.output
    assert res.stdout == ""
    assert not out.exists() or not any(p.name.startswith("v0") for p in out.iterdir())


def test_verify_reads_the_catalog_with_the_columns_the_bundle_was_built_with(tmp_path):
    sids = np.random.default_rng(1).integers(0, 9, size=(100, 2))
    table = pa.table({"pid": [f"p{i}" for i in range(100)], "l0": sids[:, 0], "l1": sids[:, 1]})
    pq.write_table(table, tmp_path / "cat.parquet")
    out = tmp_path / "b"
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "-o", str(out), "--sid-columns", "l0,l1", "--item-column",
        "pid", "--codebook-sizes", "9,9", "-q",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    # No column flags and no config: the manifest's settings say how build read the catalog.
    res = invoke("verify", str(out), "--catalog", str(tmp_path / "cat.parquet"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True
    # Flags still win over the recorded columns (here: wrongly, so the read fails naming the column).
    res = invoke("verify", str(out), "--catalog", str(tmp_path / "cat.parquet"), "--item-column", "nope")
    assert res.exit_code == 2 and "column 'nope' not found" in res.stderr, res.output
    res = invoke("verify", str(out), "--catalog", str(tmp_path / "cat.parquet"), "--sid-column", "l0")
    assert res.exit_code == 2 and "column 'l0' has type int64; a SID column must be a list" in res.stderr


def test_load_settings_layers_recorded_catalog_columns(tmp_path):
    recorded = {"sid_column": "sid", "sid_columns": ["a", "b"], "item_column": "pid", "workers": 7}
    s = load_settings(None, None, recorded=recorded)
    assert (s.sid_columns, s.item_column, s.workers) == (("a", "b"), "pid", 0)  # columns only
    s = load_settings(None, {"sid_column": "code", "sid_columns": ()}, recorded=recorded)
    assert (s.sid_column, s.sid_columns, s.item_column) == ("code", (), "pid")  # one SID layout, not half
    config = tmp_path / "c.toml"
    config.write_text('[build]\nitem_column = "id"\n')
    s = load_settings(config, None, recorded=recorded)
    assert (s.sid_columns, s.item_column) == (("a", "b"), "id")
    config.write_text('[build]\nsid_column = "code"\n')  # names the list column only: no recorded sid_columns
    s = load_settings(config, None, recorded=recorded)
    assert (s.sid_column, s.sid_columns, s.item_column) == ("code", (), "pid")
    with pytest.raises(InputError, match="recorded settings: item_column = 3 has the wrong type"):
        load_settings(None, None, recorded={"item_column": 3})


def test_rebuild_verifies_a_catalog_read_through_custom_columns(tmp_path):
    """rebuild passes no column options to verify: it must still read the catalog as build did."""
    rng = np.random.default_rng(2)
    sids = rng.integers(0, 8, size=(300, 3))
    columns = {"pid": [f"p{i}" for i in range(300)], **{f"c{t}": sids[:, t] for t in range(3)}}
    pq.write_table(pa.table(columns), tmp_path / "cat.parquet")
    out = tmp_path / "bundles"
    proc = run_rebuild(
        tmp_path / "cat.parquet", "--out", out, "--sid-columns", "c0,c1,c2", "--item-column", "pid",
        "--codebook-sizes", "8,8,8", "--device", "cpu",
        "--tune-args", "--batch-sizes 2 --beam-width 2 --warmup 0 --iters 1 --hidden-dim 4", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{(out / 'v000001').resolve()}\n"


def test_tune_prints_the_plan_table(tmp_path):
    """The table shows, for every plan entry, the chosen mode, each mode's median ms and the speed-up of the
    chosen mode over `full`, as the plan file records them."""
    make_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "b"
    build(tmp_path, out, "-q")
    res = invoke(
        "tune", str(out), "--device", "cpu", "--batch-sizes", "2,8", "--beam-width", "4", "--warmup", "0",
        "--iters", "1", "--hidden-dim", "8",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (plan_file,) = (out / "v000001" / "plans").glob("*.json")
    plan = json.loads(plan_file.read_text())
    assert res.stdout.splitlines()[-1] == f"plan written: {plan_file.resolve()}"
    table = [
        [cell.strip() for cell in line.strip("│┃ ").split("│" if "│" in line else "┃")]
        for line in res.stdout.splitlines()
        if line.startswith(("│", "┃"))
    ]
    modes = list(dict.fromkeys(m for e in plan["entries"] for m in e["timings_ms"]))
    assert {"full", "selective"} <= set(modes)
    assert table[0] == ["dtype", "step", "batch", "rows", "chosen", *[f"{m} ms" for m in modes], "vs full"]
    assert len(table) == 1 + len(plan["entries"]) == 1 + 2 * 3
    for row, e in zip(table[1:], plan["entries"], strict=True):
        t = e["timings_ms"]
        assert row[:5] == [e["dtype"], str(e["step"]), str(e["batch_size"]), str(e["rows"]), e["mode"]]
        assert row[5:-1] == [f"{t[m]:.3f}" if m in t else "-" for m in modes]
        assert row[-1] == f"{t['full'] / t[e['mode']]:.2f}x"


def test_usage_errors_exit_2(tmp_path):
    assert invoke("build").exit_code == 2
    assert invoke("build", "x.parquet", "--no-such-option").exit_code == 2
    for command in ("build", "verify"):
        res = invoke(command, "x.parquet", "--sid-column", "a", "--sid-columns", "b,c")
        assert res.exit_code == 2 and "mutually exclusive" in res.stderr, (command, res.output)


def test_corrupt_bundle_exits_1_naming_the_file(tmp_path):
    make_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "b"
    build(tmp_path, out, "-q")
    manifest = json.loads((out / "v000001" / "manifest.json").read_text())
    name = next(iter(manifest["steps"][-1]["files"].values()))
    victim = out / "v000001" / name
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    res = invoke("verify", str(out))
    assert res.exit_code == 1
    lines = stderr_lines(res)
    assert len(lines) == 1 and name in lines[0]


def test_verify_against_a_different_catalog_fails(tmp_path):
    make_catalog(tmp_path / "cat.parquet", seed=0)
    make_catalog(tmp_path / "other.parquet", seed=1)
    out = tmp_path / "b"
    build(tmp_path, out, "-q")
    res = invoke("verify", str(out), "--catalog", str(tmp_path / "other.parquet"))
    assert res.exit_code == 1
    errors = [line for line in stderr_lines(res) if line.startswith("error:")]
    assert len(errors) == 1 and str(out / "v000001") in errors[0] and "Traceback" not in res.output


def test_missing_bundle_is_an_error_not_a_traceback(tmp_path):
    res = invoke("inspect", str(tmp_path / "nothing-here"))
    assert res.exit_code == 2 and len(stderr_lines(res)) == 1 and "Traceback" not in res.output


#: Every command with its argument and every option flag: the CLI's contract.
COMMANDS = {
    "build": ("CATALOG", "--out", "-o", "--config", "-c", "--codebook-sizes", "--infer-codebook-sizes",
              "--sid-column", "--sid-columns",
              "--item-column", "--workers", "-j", "--step-formats", "--device", "--model-version", "--keep",
              "--promote", "--no-promote", "--kernel-archs", "--engine", "--ray-address", "--partitions",
              "--guards", "--accept-change", "--json", "--quiet", "-q", "--metrics-file"),
    "inspect": ("BUNDLE", "--config", "-c", "--json", "--available"),
    "verify": ("BUNDLE", "--catalog", "--config", "-c", "--sid-column", "--sid-columns", "--item-column",
               "--trusted-keys", "--json", "--quiet", "-q", "--metrics-file"),
    "promote": ("VERSION_DIR", "--trusted-keys", "--allow-unsigned", "--signing-key", "--guards",
                "--accept-change", "--config", "-c", "--metrics-file"),
    "diff": ("OLD", "NEW", "--json"),
    "tune": ("BUNDLE", "--gpu", "--device", "--batch-sizes", "--beam-width", "--dtypes", "--hidden-dim",
             "--weights", "--warmup", "--iters", "--config", "-c", "--json", "--quiet", "-q", "--reuse-from",
             "--retune", "--metrics-file"),
    "compare": ("BUNDLE", "--model", "--requests", "--beam-width", "--k", "--batch-size", "--device",
                "--request-column", "--target-column", "--config", "-c", "--json", "--available",
                "--hf-model", "--sid-map", "--min-overlap", "--max-recall-gap", "--record", "--model-tag"),
    "push": ("VERSION_DIR", "S3_URL", "--promote", "--no-promote", "--keep", "--signing-key", "--root-out",
             "--allow-unsigned", "--config", "-c", "--json", "--quiet", "-q", "--metrics-file"),
    "pull": ("S3_URL", "OUT", "--version", "--keep", "--verify", "--follow-remote", "--trusted-keys",
             "--trusted-root", "--allow-unsigned", "--json", "--quiet", "-q", "--metrics-file"),
    "status": ("OUT", "--verify", "--trusted-keys", "--trusted-root", "--allow-unsigned", "--config", "-c",
               "--json", "--metrics-file"),
    "rebuild": ("--gpu", "--device", "--tune-args", "--retune", "--gate-model", "--gate-sid-map",
                "--gate-model-fn", "--gate-requests", "--min-overlap", "--gate-args", "--push", "--push-keep",
                "--push-signing-key", "--guards", "--no-guards", "--accept-change", "--force",
                "--metrics-file", "--report"),
    "report": ("OUT", "--output", "-o", "--last", "-n", "--plots", "--no-plots"),
    "config": ("--show-defaults", "--check"),
    "demo-catalog": ("OUT", "--items", "-n", "--codebook-sizes", "-V", "--seed", "--mode", "--item-ids"),
    "keys": (),
}  # fmt: skip


def test_help_on_every_command():
    import re

    import typer

    group = typer.main.get_command(app)
    assert list(group.list_commands(None)) == list(COMMANDS)
    root = invoke("--help")
    assert root.exit_code == 0
    for command, names in COMMANDS.items():
        assert re.search(rf"^  {command} ", root.stdout, re.M), command
        params = group.commands[command].params
        declared = {
            name if p.param_type_name == "option" else p.metavar
            for p in params
            for name in (*p.opts, *p.secondary_opts)
        }
        assert declared == set(names), command
        for flag in ("-h", "--help"):
            res = invoke(command, flag)
            assert res.exit_code == 0 and res.stdout.startswith(f"Usage: zerogr {command} "), command
            for name in names:  # each listed, not hidden, as a whole word
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", res.stdout), (command, name)


def test_usage_lines_name_arguments_bare():
    """`zerogr build [OPTIONS] CATALOG`, not Typer's `{CATALOG}`, for every command."""
    import typer

    group = typer.main.get_command(app)
    for command in group.list_commands(None):
        usage = invoke(command, "--help").stdout.splitlines()[0]
        assert "{" not in usage and "}" not in usage, usage
    assert invoke("build", "--help").stdout.startswith("Usage: zerogr build [OPTIONS] CATALOG\n")
    assert invoke("promote", "--help").stdout.startswith("Usage: zerogr promote [OPTIONS] VERSION_DIR\n")


def test_tune_config_help_names_the_tune_table():
    assert "[tune] table" in " ".join(invoke("tune", "--help").stdout.split())


def test_repo_shim_runs_as_a_subprocess(tmp_path):
    make_catalog(tmp_path / "cat.parquet", n=50)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    shim = [sys.executable, str(REPO / "cli.py"), "build"]
    proc = subprocess.run(
        [*shim, str(tmp_path / "nope.parquet"), "-o", str(tmp_path / "b"), "--codebook-sizes", "12,12,12"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nope.parquet" in proc.stderr
    proc = subprocess.run(
        [*shim, str(tmp_path / "cat.parquet"), "-o", str(tmp_path / "b"), "--codebook-sizes", "12,12,12",
         "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["items"] == 50


# ------------------------------------------------------------------------------------------ config


def test_default_toml_matches_the_dataclass_defaults():
    data = tomllib.loads((REPO / "zerogr_build" / "configs" / "default.toml").read_text())
    assert "build" in data and set(data) <= KNOWN_TABLES  # other commands keep their own tables
    defaults = {f.name: getattr(BuildSettings(), f.name) for f in dataclasses.fields(BuildSettings)}
    as_toml = {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}
    assert data["build"] == as_toml
    assert load_settings(REPO / "zerogr_build" / "configs" / "default.toml") == BuildSettings()


def test_overrides_beat_the_file_and_none_means_not_given(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[build]\nout = "x"\nworkers = 3\ncodebook_sizes = [4, 5]\n')
    s = load_settings(config, {"workers": 1, "out": None})
    assert (s.out, s.workers, s.codebook_sizes) == ("x", 1, (4, 5))
    assert load_settings(None, {"sid_columns": " c0, c1,,c2"}).sid_columns == ("c0", "c1", "c2")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[build]\nworkerz = 2\n", "unknown setting 'workerz'"),
        ("[buidl]\nworkers = 2\n", r"unknown table \[buidl\]"),
        ("workers = 2\n", "top-level key 'workers'"),
        ("[build]\nworkers = 'two'\n", "workers = 'two' has the wrong type"),
        ("[build]\ncodebook_sizes = [1, 'a']\n", "codebook_sizes .* wrong type"),
        ("[build]\ndense_min_share = 2.0\n", "dense_min_share must be in 0..1"),
        ("[build]\ndevice = 'tpu'\n", "device must be cpu or cuda:N"),
        ("[build\n", "invalid TOML"),
    ],
)
def test_bad_config_files(tmp_path, text, message):
    config = tmp_path / "c.toml"
    config.write_text(text)
    with pytest.raises(InputError, match=message):
        load_settings(config)


def test_missing_config_file(tmp_path):
    with pytest.raises(InputError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


@pytest.mark.gpu
def test_build_streams_tables_to_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    make_catalog(tmp_path / "cat.parquet")
    res = invoke(
        "build", str(tmp_path / "cat.parquet"), "-o", str(tmp_path / "b"), "--codebook-sizes", "12,12,12",
        "--device", "cuda:0", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    load = summary["device_load"]
    manifest = json.loads((tmp_path / "b" / "v000001" / "manifest.json").read_text())
    # The Decoder's own load: the step tables only (leaf offsets stay on the host).
    table_files = [name for step in manifest["steps"] for name in step["files"].values()]
    npy_payload = sum(np.load(tmp_path / "b" / "v000001" / name).nbytes for name in table_files)
    assert load["device"] == "cuda:0" and load["bytes"] == npy_payload
