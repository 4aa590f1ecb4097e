"""Fixtures for the reference-backend tests (model builders live in reference_helpers; the tiny
pairs qwen3_pair / llama_pair are tests/conftest.py's)."""

from reference_helpers import one_thread as _one_thread  # noqa: F401  (autouse)
