"""Which processor each of vLLM's model runners takes, checked with vLLM's own loaders (no engine): Model
Runner V2's loader builds PROCESSOR_V2 (by class path and as a class) and refuses the V1 class; V1's loader
the other way round; V2's admission validator refuses a bad request and pins a good one; under speculative
decoding the V2 processor refuses to start."""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.worker.gpu.sample.logits_processor import (
    build_custom_logits_processors,
    build_custom_logits_processors_params_validator,
)

from zerogr_build.base.errors import InputError
from zerogr_build.integrations.vllm import PROCESSOR, PROCESSOR_V2, SidLogitsProcessor, SidLogitsProcessorV2
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.admission import PIN_KEY
from zerogr_build.integrations.vllm.v2_batch import request_state


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("runners")
    tiny.publish(root / "out", tiny.catalog_sids(30, seed=2))
    tiny.sid_map().save(root / "sid_map.json")
    return tiny.write_registry(root / "catalogs.toml", {"c": {"bundle": "out", "sid_map": "sid_map.json"}})


def test_v2_loader_takes_processor_v2_and_refuses_the_v1_class(registry, engine_config):
    config = engine_config(registry)
    for given in (PROCESSOR_V2, SidLogitsProcessorV2):
        (built,) = build_custom_logits_processors(config, request_state(config, 4), False, [given])
        assert isinstance(built, SidLogitsProcessorV2)
    with pytest.raises(ValueError, match="SidLogitsProcessor is not a subclass of vllm.v1.worker.gpu"):
        build_custom_logits_processors(config, request_state(config, 4), False, [PROCESSOR])


def test_v1_loader_takes_processor_and_refuses_the_v2_class(registry, engine_config):
    config = engine_config(registry)
    built = build_logitsprocs(config, torch.device("cpu"), False, False, [PROCESSOR])
    assert any(isinstance(p, SidLogitsProcessor) for p in built.all)
    with pytest.raises(ValueError, match="SidLogitsProcessorV2"):
        build_logitsprocs(config, torch.device("cpu"), False, False, [PROCESSOR_V2])


def test_v2_admission_refuses_bad_requests_and_pins_good_ones(registry, engine_config):
    config = engine_config(registry)
    build_custom_logits_processors(config, request_state(config, 4), False, [PROCESSOR_V2])  # an engine
    validate = build_custom_logits_processors_params_validator([PROCESSOR_V2])
    good = SamplingParams(extra_args={"zerogr": {"catalog": "c"}, PIN_KEY: "v000099"})
    validate(good)
    assert good.extra_args[PIN_KEY] == "v000001"  # the client's pin replaced by the engine's version
    with pytest.raises(VLLMValidationError, match="unknown catalog 'nope'"):
        validate(SamplingParams(extra_args={"zerogr": {"catalog": "nope"}}))
    plain = SamplingParams(extra_args={"other": 1})
    validate(plain)
    assert plain.extra_args == {"other": 1}


def test_v2_refuses_speculative_decoding(registry, engine_config):
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    config = engine_config(registry, speculative_config=spec)
    with pytest.raises(InputError, match="cannot mask draft tokens exactly under speculative decoding"):
        build_custom_logits_processors(config, request_state(config, 4), False, [PROCESSOR_V2])
