"""The yardsticks in benchmarks/ (not packaged), loaded from this checkout by path for the scripts beside
this file: `from _yardsticks import yardstick; static_baseline = yardstick("static_baseline")`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def yardstick(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `benchmarks.<name>` (loaded once per process)."""
    qualified = f"benchmarks.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module
