"""Shared pytest set-up: CI runs hypothesis derandomized (the same examples every run, so a red CI
points at a change, not at a lucky draw); locally every run draws new examples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# --- GPU kernels (issue 10) ---
# Every bundle the suite builds ships compiled kernels when nvcc is found: one session-wide cache folder
# means nvcc runs once per (source, arch, kind) for the whole run, not once per build, and the user's
# ~/.cache/zerogr is never touched. CLI subprocesses inherit it through the environment.
if not os.environ.get("ZEROGR_CACHE_DIR"):
    import tempfile

    os.environ["ZEROGR_CACHE_DIR"] = tempfile.mkdtemp(prefix="zerogr-test-cache-")
