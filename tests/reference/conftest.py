"""Fixtures for the reference-backend tests (model builders live in reference_helpers)."""

import pytest
import torch
from reference_helpers import make_drafter, make_target


@pytest.fixture(autouse=True)
def _one_thread():
    """These models are tiny, so every op is overhead-bound; with 2 OpenMP threads on a
    busy 2-core machine each op can wait tens of ms at the barrier. One thread is faster
    and gives identical results; the session setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def qwen3_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_pair")
    t = make_target(root / "target", "qwen3")
    return t, make_drafter(root / "drafter", t)


@pytest.fixture(scope="session")
def llama_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_pair")
    t = make_target(root / "target", "llama", seed=1)
    return t, make_drafter(root / "drafter", t, seed=1, target_layer_ids=(1, 3))
