"""zerogr: per-step constrained-decoding indexes for generative recommenders.

Public API (everything else is internal):
    build_index(sids, codebook_sizes) -> SidIndex       the step tables, in memory (pure numpy/numba)
    read_catalog(path, ...) -> Catalog                  a Parquet SID catalog, validated
    publish_bundle / open_bundle / verify_bundle        the versioned on-disk bundle (docs/bundle-format.md)
    Decoder(index_or_bundle, weights, device, order, plan)   filter-first constrained beam search (torch)
    tune_bundle / find_plan                             per-step scoring plans measured on a device
    HotSwap, load_arrays_to_device                      double-buffered loading and version swaps on a GPU
Nothing here imports torch, cupy or CUDA at import time.
"""

from .bundle import (
    Bundle,
    add_bundle_files,
    open_bundle,
    promote_bundle,
    publish_bundle,
    resolve_bundle,
    verify_bundle,
)
from .catalog import Catalog, read_catalog
from .config import BuildSettings, TuneSettings, load_settings
from .errors import BundleError, InputError, ZerogrError
from .index import FormatPolicy, SidIndex, StepTable, build_index
from .runtime.hotswap import HotSwap
from .runtime.plan import find_plan
from .runtime.stream import load_arrays_to_device, open_bundle_on_device

__version__ = "0.1.0"


def __getattr__(name: str):
    """Decoder, BeamState, SearchResult and tune_bundle load on first use (they import torch; the CLI need
    not)."""
    if name in ("Decoder", "BeamState", "SearchResult"):
        from .runtime import decoder

        return getattr(decoder, name)
    if name == "tune_bundle":
        from .tune import tune_bundle

        return tune_bundle
    raise AttributeError(f"module 'zerogr_build' has no attribute {name!r}")


__all__ = [
    "BeamState",
    "BuildSettings",
    "Bundle",
    "BundleError",
    "Catalog",
    "Decoder",
    "FormatPolicy",
    "HotSwap",
    "InputError",
    "SearchResult",
    "SidIndex",
    "StepTable",
    "TuneSettings",
    "ZerogrError",
    "add_bundle_files",
    "build_index",
    "find_plan",
    "load_arrays_to_device",
    "load_settings",
    "open_bundle",
    "open_bundle_on_device",
    "promote_bundle",
    "publish_bundle",
    "read_catalog",
    "resolve_bundle",
    "tune_bundle",
    "verify_bundle",
]
