"""Shared pytest set-up: CI runs hypothesis derandomized (the same examples every run, so a red CI
points at a change, not at a lucky draw); locally every run draws new examples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
