"""zerogr in vLLM (V1 engine; extra `[vllm]`, its own venv - docs/serving-engines.md).

    from vllm import LLM, SamplingParams
    from zerogr_build.integrations.vllm import SidLogitsProcessor, beam_search

    llm = LLM(model, logits_processors=[PROCESSOR])   # the class path; or the class itself (see below)
    params = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": {"bundle": "bundles/",
                                                                      "sid_map": "sid_map.json"}})
    outs = llm.generate(prompts, params)                 # every opted-in request decodes a catalog SID
    out = beam_search(llm, prompts, "bundles/", "sid_map.json", beam_width=20)   # constrained beams

On vLLM's CPU backend name the processor by its class path (PROCESSOR) and start workers with
VLLM_WORKER_MULTIPROC_METHOD=spawn: a CPU worker scans every imported module at start-up and breaks on
numba's llvmlite, which zerogr imports, so no zerogr module may be loaded in a worker before that scan.

Importing this package imports vllm; `import zerogr_build` never does.
"""

from __future__ import annotations

from .beam import BeamSearchOutput, beam_search
from .processor import SidLogitsProcessor
from .spec import RequestSpec, spec_of

PROCESSOR = "zerogr_build.integrations.vllm:SidLogitsProcessor"  # for LLM(logits_processors=[...])

__all__ = ["PROCESSOR", "BeamSearchOutput", "RequestSpec", "SidLogitsProcessor", "beam_search", "spec_of"]
