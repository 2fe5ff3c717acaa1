"""zerogr for Hugging Face transformers models (extra `[hf]`): the public names, from one place.

    from transformers import LogitsProcessorList
    from zerogr_build.integrations import hf as zg_hf

    sid_map = zg_hf.SidMap.from_offsets([o_0, ..., o_{L-1}], eos_token_id=None)
    proc = zg_hf.SidLogitsProcessor(bundle, sid_map)          # HF generate, constrained to the catalog
    out = model.generate(input_ids, num_beams=M, num_return_sequences=M, max_new_tokens=L,
                         logits_processor=LogitsProcessorList([proc]))
    res = zg_hf.generate(model, bundle, input_ids, beam_width=M, order="filter_first", sid_map=sid_map)
    search = zg_hf.hf_search(zg_hf.SidGenerator(model, bundle, sid_map), inputs_of)  # compare_searches
    report = zg_hf.run_hf_compare(bundle_dir, "ckpt/", "sid_map.json", "requests.parquet")  # zerogr compare
    gen = zg_hf.SidGenerator(model, bundle, sid_map, order="auto")   # follows the recorded quality gate

Importing this module imports transformers; `import zerogr_build` never does.
"""

from __future__ import annotations

from ..sid_map import SidMap
from .compare import hf_search, run_hf_compare, token_inputs
from .generate import SidGenerator, generate
from .load import load_hf_model, model_hash
from .processor import SidLogitsProcessor

__all__ = [
    "SidGenerator",
    "SidLogitsProcessor",
    "SidMap",
    "generate",
    "hf_search",
    "load_hf_model",
    "model_hash",
    "run_hf_compare",
    "token_inputs",
]
