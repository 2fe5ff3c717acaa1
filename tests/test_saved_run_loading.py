"""A saved MovieLens run (experiments/movielens/run.py) loads through torch's weights-only unpickler: what
save_run writes loads, and a model.pt whose pickle would run code is refused, exit 2 naming the file,
with none of its code run."""

from __future__ import annotations

import builtins
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from experiments.movielens import ml100k
from experiments.movielens.run import SidCatalog, build_bundle, load_run_model_fn, save_run
from zerogr_build.base.errors import InputError

from .cli_runs import invoke, one_error_line

SIZES = (3, 3)


class _OpensAFile:
    """Unpickling this calls open(marker, "w"): any code could run the same way."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def _tiny_run(tmp_path):
    from experiments.movielens.model import ModelConfig, TigerLike

    cfg = ModelConfig(d_model=8, n_heads=2, enc_layers=1, dec_layers=1, max_history=4)
    torch.manual_seed(0)
    model = TigerLike(SIZES, cfg)
    sids = np.array([[a, b] for a in range(3) for b in range(3)], dtype=np.int64)
    histories = {u: np.array([u % 9, (u + 1) % 9], dtype=np.int64) for u in range(4)}
    run = tmp_path / "run"
    save_run(run, model, sids, histories, {0: 1})
    catalog = SidCatalog(sids=sids, codebook_sizes=SIZES, item_ids=np.arange(9, dtype=np.int64))
    build_bundle(catalog, run / "bundles")
    return run, model, sids, histories


def test_what_save_run_writes_loads_weights_only(tmp_path):
    run, model, sids, histories = _tiny_run(tmp_path)
    torch.load(run / "model.pt", weights_only=True)  # the format itself needs no other unpickler
    weights, step_fn = load_run_model_fn(run)(None, [0, 1])
    for got, want in zip(weights, model.output_weights(), strict=True):
        assert torch.equal(got, want)
    assert step_fn(1, torch.as_tensor(sids[:2, :1]), torch.tensor([0, 1])).shape == (2, 8)


@pytest.mark.parametrize("form", ["torch zip", "torch legacy", "plain pickle"])
def test_a_model_pt_that_would_run_code_is_refused_unrun(tmp_path, monkeypatch, form):
    run, *_ = _tiny_run(tmp_path)
    marker = tmp_path / "code-ran"
    blob = {"config": _OpensAFile(str(marker)), "codebook_sizes": list(SIZES)}
    if form == "plain pickle":
        (run / "model.pt").write_bytes(pickle.dumps(blob))
    else:
        torch.save(blob, run / "model.pt", _use_new_zipfile_serialization=form == "torch zip")
    with pytest.raises(InputError, match="model.pt"):
        load_run_model_fn(run)
    assert not marker.exists()

    monkeypatch.setenv("ZEROGR_ML100K_RUN", str(run))
    monkeypatch.setattr(ml100k, "_LOADED", {})
    pq.write_table(pa.table({"request_id": [0, 1], "target_item": [1, 2]}), tmp_path / "requests.parquet")
    done = invoke(
        "compare", run / "bundles", "--model", "experiments.movielens.ml100k:model_fn",
        "--requests", tmp_path / "requests.parquet", "--beam-width", 2, "--k", 1,
    )  # fmt: skip
    line = one_error_line(done, 2)
    assert str(run / "model.pt") in line and "refused" in line
    assert not marker.exists()


def test_a_model_pt_of_another_shape_is_exit_2_naming_the_key(tmp_path):
    run, *_ = _tiny_run(tmp_path)
    blob = torch.load(run / "model.pt", weights_only=True)
    del blob["histories"]
    torch.save(blob, run / "model.pt")
    with pytest.raises(InputError, match="'histories'"):
        load_run_model_fn(run)
