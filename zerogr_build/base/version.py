"""The version of zerogr (pyproject.toml's `version`): low, so every layer that records it may import it."""

__version__ = "0.1.0"
