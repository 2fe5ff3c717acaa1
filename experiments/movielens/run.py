"""The reproduction's glue, reusable: dataset -> SIDs -> catalog Parquet -> bundle -> model -> compare.

`experiments/quality_ml100k.py` runs these on MovieLens-100K; the tests run them on a tiny generated dataset.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zerogr_build.base.errors import InputError, one_line
from zerogr_build.base.progress import NULL_PROGRESS, Progress

from .data import ItemInfo, Split
from .sids import genre_features, interaction_embeddings, semantic_ids


@dataclass(frozen=True)
class SidCatalog:
    """SIDs of the split's items: sids int64 [I, L] (row i = item i), codebook_sizes, raw item_ids [I]."""

    sids: np.ndarray
    codebook_sizes: tuple[int, ...]
    item_ids: np.ndarray


def make_sids(
    split: Split,
    info: ItemInfo | None,
    *,
    codebook_sizes: Sequence[int] = (32, 32, 32),
    svd_dim: int = 32,
    genre_weight: float = 0.5,
    seed: int = 0,
) -> SidCatalog:
    """Embeddings from training interactions (+ genres when `info` is given) -> unique SIDs (L+1 tokens)."""
    side = None
    if info is not None:
        row_of = {int(r): i for i, r in enumerate(info.item_ids)}
        side = genre_features(
            [info.genres[row_of[int(r)]] if int(r) in row_of else [] for r in split.item_ids]
        )
        if side.shape[1] == 0:
            side = None
    emb = interaction_embeddings(
        split.train_sequences, len(split.item_ids), svd_dim, side_features=side, side_weight=genre_weight
    )
    sids, sizes = semantic_ids(emb, codebook_sizes, seed=seed)
    return SidCatalog(sids=sids, codebook_sizes=sizes, item_ids=split.item_ids)


def write_catalog(path: str | Path, catalog: SidCatalog) -> Path:
    """Catalog Parquet: item_id int64, sid list<int32> (the `zerogr build` input format)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sid_col = pa.array(catalog.sids.astype(np.int32).tolist(), type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": pa.array(catalog.item_ids, type=pa.int64()), "sid": sid_col}), path)
    return path


def build_bundle(
    catalog: SidCatalog,
    out_dir: str | Path,
    *,
    model_version: str | None = None,
    progress: Progress = NULL_PROGRESS,
) -> Any:
    """build_index + publish_bundle into out_dir, then open the new version (returns the Bundle)."""
    import pyarrow as pa

    from zerogr_build.bundle import open_bundle, publish_bundle
    from zerogr_build.index import build_index

    index = build_index(catalog.sids, catalog.codebook_sizes)
    published = publish_bundle(
        index,
        pa.array(catalog.item_ids, type=pa.int64()),
        out_dir,
        manifest_fields={"model_version": model_version},
        progress=progress,
    )
    return open_bundle(published.path)


def model_fn_for(model: Any, histories: dict[Any, np.ndarray], sids: np.ndarray):
    """A `zerogr compare` model function (see zerogr_build.compare) over a trained TigerLike.

    histories: request id -> item indices int [n] (oldest first); sids int [I, L] (item index -> SID).
    Returns function(bundle, request_ids) -> (weights, step_fn).
    """
    from .model import RequestEncoder

    weights = model.output_weights()

    def model_fn(bundle: Any, request_ids: list) -> tuple[list, Any]:
        encoder = RequestEncoder(model, [histories[r] for r in request_ids], sids)
        return weights, encoder.step_fn

    return model_fn


def save_run(
    path: str | Path, model: Any, sids: np.ndarray, histories: dict[Any, np.ndarray], targets: dict[Any, Any]
) -> tuple[Path, Path]:
    """Save a trained run so `zerogr compare` can load it: model.pt (config, weights, SIDs, histories) and
    requests.parquet (request_id, target_item). Returns both paths."""
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    blob = {
        "config": dataclasses.asdict(model.cfg),
        "codebook_sizes": list(model.codebook_sizes),
        "state_dict": model.state_dict(),
        "sids": torch.as_tensor(np.asarray(sids, dtype=np.int64)),
        "histories": {k: torch.as_tensor(np.asarray(v, dtype=np.int64)) for k, v in histories.items()},
    }
    torch.save(blob, path / "model.pt")
    ids = list(histories)
    pq.write_table(
        pa.table({"request_id": pa.array(ids), "target_item": pa.array([targets.get(r) for r in ids])}),
        path / "requests.parquet",
    )
    return path / "model.pt", path / "requests.parquet"


def load_run_model_fn(path: str | Path):
    """The `zerogr compare` model function of a run saved by save_run (path: its directory).

    model.pt is read with torch's weights-only unpickler, which builds tensors and plain data and nothing
    else: a file that needs any other object (code that would run while it loads) is refused, InputError
    naming it, and none of its code runs."""
    import torch

    from .model import ModelConfig, TigerLike

    file = Path(path) / "model.pt"
    try:
        with warnings.catch_warnings():  # torch's notes on the file's pickle protocol: the refusal says it
            warnings.simplefilter("ignore")
            blob = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InputError(
            f"{file}: holds objects other than tensors and plain data (a saved run never does); refused"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise InputError(
            f"{file}: not a readable saved run ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    _check_run_blob(file, blob)
    try:
        model = TigerLike(blob["codebook_sizes"], ModelConfig(**blob["config"]))
        model.load_state_dict(blob["state_dict"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InputError(
            f"{file}: the saved model does not load ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    model.eval()
    histories = {k: v.numpy() for k, v in blob["histories"].items()}
    return model_fn_for(model, histories, blob["sids"].numpy())


def _check_run_blob(file: Path, blob: Any) -> None:
    """InputError naming the file and the key unless blob has save_run's keys and kinds."""
    import torch

    if not isinstance(blob, dict):
        raise InputError(f"{file}: not a saved run (a {type(blob).__name__}, not a dict)")
    kinds = {
        "config": dict,
        "codebook_sizes": list,
        "state_dict": dict,
        "sids": torch.Tensor,
        "histories": dict,
    }
    for key, kind in kinds.items():
        if not isinstance(blob.get(key), kind):
            raise InputError(f"{file}: not a saved run ({key!r} is missing or not a {kind.__name__})")
    if not all(isinstance(v, torch.Tensor) for v in blob["histories"].values()):
        raise InputError(f"{file}: not a saved run ('histories' holds something other than tensors)")
