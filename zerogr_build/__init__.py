"""zerogr: per-step constrained-decoding indexes for generative recommenders.

Public API (everything else is internal):
    build_index(sids, codebook_sizes)  -> SidIndex        the step tables, in memory
"""

from .errors import BundleError, InputError, ZerogrError
from .index import FormatPolicy, SidIndex, StepTable, build_index

__version__ = "0.1.0"

__all__ = [
    "BundleError",
    "FormatPolicy",
    "InputError",
    "SidIndex",
    "StepTable",
    "ZerogrError",
    "build_index",
]
