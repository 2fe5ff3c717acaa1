"""`zerogr config --check FILE`: exit 0 for a file every command would accept (the shipped
deploy/rebuild.toml and the packaged defaults among them), exit 2 with one line naming the file, the table
and the bad key otherwise; and the shipped deploy/rebuild.toml drives a real rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerogr_build.base.errors import InputError
from zerogr_build.config import TUNE_ORDERS, check_config_file, default_config_text, load_settings
from zerogr_build.runtime.decoder import ORDERS
from zerogr_build.synthetic import write_catalog

from .cli_runs import REPO, TUNE_ARGS, invoke, one_error_line

SHIPPED = REPO / "deploy" / "rebuild.toml"
UNIT = REPO / "deploy" / "systemd" / "zerogr-rebuild.service"


def test_the_shipped_rebuild_config_checks_clean() -> None:
    done = invoke("config", "--check", SHIPPED)
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        f"{SHIPPED} [build]: ok (out, codebook_sizes, keep, workers)",
        f"{SHIPPED} [tune]: ok (batch_sizes, beam_width)",
        f"{SHIPPED} [guards]: ok (min_items_ratio, max_items_removed)",
        f"{SHIPPED} [fleet]: ok (timestamp_expiry_days)",
    ]
    assert done.stderr == ""


def test_the_shipped_config_is_the_one_the_systemd_unit_reads_and_sets_what_it_leaves_out() -> None:
    assert "--config /etc/zerogr/rebuild.toml" in UNIT.read_text()
    assert "--codebook-sizes" not in UNIT.read_text() and "--out" not in UNIT.read_text()
    settings = load_settings(SHIPPED)
    assert settings.out == "/srv/bundles" and settings.codebook_sizes == (2048, 2048, 2048)
    assert settings.keep == 5


def test_the_packaged_defaults_check_with_a_note_on_codebook_sizes(tmp_path: Path) -> None:
    path = tmp_path / "zerogr.toml"
    path.write_text(default_config_text())
    done = invoke("config", "--check", path)
    assert done.exit_code == 0, done.output
    assert [line.split(": ok")[0] for line in done.stdout.splitlines()] == [
        f"{path} [{t}]" for t in ("build", "tune", "guards", "fleet")
    ]
    assert "note: [build] codebook_sizes is not set" in done.stderr


def test_an_empty_file_keeps_every_default(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("# nothing set\n")
    done = invoke("config", "--check", path)
    assert done.exit_code == 0 and done.stdout == f"{path}: ok (empty: every key keeps its default)\n"


BAD = {  # case: (text of the shipped file, what replaces it, what the error line names)
    "unknown build key": ("[build]\n", "[build]\ncodebook_size = [8]\n",
                          "[build]: unknown setting 'codebook_size'"),
    "build wrong type": ("keep = 5", 'keep = "5"', "[build]: keep = '5' has the wrong type"),
    "build out of range": ("keep = 5", "keep = -1", "[build]: keep must be >= 0"),
    "build step_formats": ("workers = 0", 'workers = 0\nstep_formats = "0=dense,0=sparse"', "step_formats"),
    "build device": ("workers = 0", 'workers = 0\ndevice = "gpu"', "[build]: device must be cpu or cuda:N"),
    "unknown tune key": ("beam_width = 16", "beam_width = 16\nbatch_size = [1]",
                         "[tune]: unknown setting 'batch_size'"),
    "tune wrong type": ("beam_width = 16", 'beam_width = "16"', "[tune]: beam_width: expected an integer"),
    "tune batch sizes": ("batch_sizes = [1, 32]", "batch_sizes = [0]",
                         "[tune]: batch_sizes: expected positive"),
    "tune device": ("beam_width = 16", 'beam_width = 16\ndevice = "cuda:x"',
                    "[tune]: device must be cpu or cuda:N"),
    "tune order": ("beam_width = 16", 'beam_width = 16\norder = "fastest"', "[tune]: order: expected one of"),
    "guards range": ("max_items_removed = 0.2", "max_items_removed = 2",
                     "[guards]: max_items_removed must be in 0..1"),
    "guards unknown": ("min_items_ratio = 0.8", "min_item_ratio = 0.8",
                       "[guards]: unknown setting 'min_item_ratio'"),
    "fleet value": ("timestamp_expiry_days = 3.0", "timestamp_expiry_days = 0",
                    "[fleet]: timestamp_expiry_days"),
    "unknown table": ("[fleet]", "[flee]", "unknown table [flee]"),
    "top-level key": ("[build]\n", 'out = "x"\n[build]\n', "top-level key 'out'"),
    "not TOML": ("keep = 5", "keep = = 5", "invalid TOML"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_key_exits_2_naming_the_file_the_table_and_the_key(case: str, tmp_path: Path) -> None:
    old, new, named = BAD[case]
    text = SHIPPED.read_text()
    assert old in text, case
    path = tmp_path / "rebuild.toml"
    path.write_text(text.replace(old, new, 1))
    line = one_error_line(invoke("config", "--check", path))
    assert line.startswith(f"error: {path}") and named in line, line
    with pytest.raises(InputError):
        check_config_file(path)


def test_a_missing_file_and_the_wrong_options_exit_2(tmp_path: Path) -> None:
    assert "not found" in one_error_line(invoke("config", "--check", tmp_path / "none.toml"))
    assert "pass one of" in one_error_line(invoke("config"))
    assert "pass one of" in one_error_line(invoke("config", "--show-defaults", "--check", SHIPPED))


def test_the_tune_orders_are_the_decoders_and_auto() -> None:
    assert (*ORDERS, "auto") == TUNE_ORDERS


def test_a_rebuild_runs_with_the_shipped_config(tmp_path: Path) -> None:
    """The unit's command with the shipped config: OUT from the command line (the config's /srv/bundles is
    the box's), everything else from the file."""
    write_catalog(tmp_path / "catalog.parquet", 3000, [2048, 2048, 2048], seed=4)
    out = tmp_path / "bundles"
    done = invoke(
        "rebuild", tmp_path / "catalog.parquet", "--config", SHIPPED, "--out", out,
        "--model-version", "ckpt-1", "--device", "cpu", "--tune-args", TUNE_ARGS,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    manifest = json.loads((out / "v000001" / "manifest.json").read_text())
    assert manifest["settings"]["codebook_sizes"] == [2048, 2048, 2048]
    assert manifest["settings"]["keep"] == 5 and manifest["settings"]["out"] == str(out)
    assert (out / "LATEST").read_text() == "v000001\n"
