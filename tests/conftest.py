"""Shared test configuration.

Markers (declared in pyproject.toml):
- slow: long-running, excluded from the default run; `pytest -m slow` runs them.
- gpu: needs an NVIDIA GPU; skipped here with the reason.
"""

import pytest
import torch

torch.set_num_threads(2)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
