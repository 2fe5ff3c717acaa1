"""zerogr in vLLM (extra `[vllm]`, its own venv - docs/serving-engines.md).

    ZEROGR_VLLM_CATALOGS=catalogs.toml   # the operator's registry: [catalogs.movies] bundle, sid_map, ...

    from vllm import LLM, SamplingParams
    from zerogr_build.integrations.vllm import PROCESSOR, PROCESSOR_V2, beam_search

    llm = LLM(model, logits_processors=[PROCESSOR])      # V1 model runner; PROCESSOR_V2 for Model Runner V2
    params = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": {"catalog": "movies"}})
    outs = llm.generate(prompts, params)                 # every opted-in request decodes a catalog SID
    out = beam_search(llm, prompts, "bundles/", "sid_map.json", beam_width=20)   # constrained beams

Which processor: vLLM 0.32 runs Model Runner V2 wherever Triton is available (every CUDA install) and logs
"Using V2 Model Runner"; VLLM_USE_V2_MODEL_RUNNER=0 (and vLLM's CPU backend) run V1. Each runner loads only
its own interface's class, and refuses the other one at start.

On vLLM's CPU backend name the processor by its class path and start workers with
VLLM_WORKER_MULTIPROC_METHOD=spawn: a CPU worker scans every imported module at start-up and breaks on
numba's llvmlite, which zerogr imports, so no zerogr module may be loaded in a worker before that scan.

Importing this package imports vllm; `import zerogr_build` never does.
"""

from __future__ import annotations

from .beam import BeamSearchOutput, beam_search
from .processor import SidLogitsProcessor
from .processor_v2 import SidLogitsProcessorV2
from .spec import RequestSpec, spec_of

PROCESSOR = "zerogr_build.integrations.vllm:SidLogitsProcessor"  # the V1 model runner's class path
PROCESSOR_V2 = "zerogr_build.integrations.vllm:SidLogitsProcessorV2"  # Model Runner V2's


def runner_processor() -> str:
    """The class path for the model runner vLLM 0.32 picks in this environment: PROCESSOR_V2 when
    VLLM_USE_V2_MODEL_RUNNER says so or, unset, wherever Triton runs; else PROCESSOR. (vLLM also falls back
    to V1 for a few features V2 lacks, saying so in its log; the runner that starts refuses the other's
    class, so a wrong guess fails at start, never silently.)"""
    import vllm.envs
    from vllm.triton_utils import HAS_TRITON

    use_v2 = vllm.envs.VLLM_USE_V2_MODEL_RUNNER
    return PROCESSOR_V2 if (HAS_TRITON if use_v2 is None else use_v2) else PROCESSOR


__all__ = [
    "PROCESSOR",
    "PROCESSOR_V2",
    "BeamSearchOutput",
    "RequestSpec",
    "SidLogitsProcessor",
    "SidLogitsProcessorV2",
    "beam_search",
    "runner_processor",
    "spec_of",
]
