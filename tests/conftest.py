"""Shared test configuration.

Markers (declared in pyproject.toml):
- slow: long-running, excluded from the default run; `pytest -m slow` runs them.
- gpu: needs an NVIDIA GPU; skipped here with the reason.
"""

import os

import pytest
import torch
from checkpoints import make_drafter, make_target

torch.set_num_threads(2)
# Triton picks interpreter or compiler when a module defines its kernels (and triton.language
# its helpers), i.e. at import: set it before any test module can import triton.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, drafter_dir) for a tiny Qwen3 target, fp32 (tests/helpers/checkpoints.py)."""
    root = tmp_path_factory.mktemp("tiny-qwen3")
    return make_target(root / "target", "qwen3"), make_drafter(root / "drafter")


@pytest.fixture(scope="session")
def embedded_run(tmp_path_factory):
    """The embedded default recipe taken through the pipeline up to deploy (shared by the OpenAI
    server's tests and profile's): the pipeline directory."""
    from trtllm_dflash.pipeline import run
    from trtllm_dflash.recipe import load_recipe

    root = tmp_path_factory.mktemp("embedded-run")
    run(load_recipe(None), root, until="deploy", progress=False, say=lambda _: None)
    return root
