"""`zerogr compare --model experiments.movielens.ml100k:model_fn`: the model quality_ml100k trained.

Importable with the repository root on the path (`PYTHONPATH=.` from the root). The run directory is
$ZEROGR_ML100K_RUN, else ~/.cache/zerogr/ml100k-run (the script's default --work-dir); the script prints
the full command, e.g.

    PYTHONPATH=. ZEROGR_ML100K_RUN=RUN zerogr compare RUN/bundles \
        --model experiments.movielens.ml100k:model_fn --requests RUN/requests.parquet --beam-width 20
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .data import DEFAULT_CACHE_DIR

_LOADED: dict[str, Any] = {}


def run_dir() -> Path:
    return Path(os.environ.get("ZEROGR_ML100K_RUN") or DEFAULT_CACHE_DIR / "ml100k-run")


def model_fn(bundle: Any, request_ids: list) -> tuple[list, Any]:
    """(weights, step_fn) for a batch of user ids (the compare contract); loads the run once per process."""
    from zerogr_build.base.errors import InputError

    from .run import load_run_model_fn

    key = str(run_dir())
    if key not in _LOADED:
        if not (Path(key) / "model.pt").exists():
            raise InputError(f"{key}/model.pt not found: run python -m experiments.quality_ml100k first")
        _LOADED[key] = load_run_model_fn(key)
    return _LOADED[key](bundle, request_ids)
