"""Pure index math: SIDs in, step tables out. No I/O, no imports from bundle/ or runtime/."""

from .build import build_index, validate_sids
from .formats import FormatPolicy, check_step_formats, choose_format, parse_step_formats
from .tables import SidIndex, StepMeta, StepTable, csr_gather, csr_parents, expand_leaf_sids

__all__ = [
    "FormatPolicy",
    "SidIndex",
    "StepMeta",
    "StepTable",
    "build_index",
    "check_step_formats",
    "choose_format",
    "csr_gather",
    "csr_parents",
    "expand_leaf_sids",
    "parse_step_formats",
    "validate_sids",
]
