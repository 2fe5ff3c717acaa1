"""scripts/gpu_check.sh cannot run without a GPU, so on the CPU: bash accepts it, and every embedded Python
part compiles and its imports resolve against this checkout (a renamed module fails here, not on the GPU)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_check.sh"


def _python_parts() -> list[str]:
    return re.findall(r"<<'EOF'\n(.*?)\nEOF\n", SCRIPT.read_text(), flags=re.S)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_gpu_check_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_gpu_check_python_parts_compile_and_import():
    parts = _python_parts()
    assert len(parts) >= 2  # env and kernels
    for part in parts:
        tree = ast.parse(part)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name != "cupy":
                        importlib.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(
                        f"{node.module}.{alias.name}"
                    ), f"{node.module}.{alias.name}"
