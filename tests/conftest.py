"""Shared test configuration.

Markers (declared in pyproject.toml):
- slow: long-running, excluded from the default run; `pytest -m slow` runs them.
- gpu: needs an NVIDIA GPU; skipped here with the reason.
"""

import os
import sys

import pytest
import torch
from checkpoints import make_drafter, make_target

# Two threads in a lone run; under pytest-xdist the workers share the cores.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:  # xdist hands its workers COLUMNS=80 / LINES=24; the commands' tables read COLUMNS
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 2) // _workers)))
# Triton picks interpreter or compiler when a module defines its kernels (and triton.language
# its helpers), i.e. at import: set it before any test module can import triton.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into workers
def pytest_cmdline_main(config):
    """With pytest-xdist installed and no -n given, the suite runs on every core (-n auto), one
    test file per worker (--dist loadfile: a file's module fixtures and servers stay in one
    process). Not on a CUDA machine, whose tests share its one device, and not under --pdb.
    -n 0 (or -p no:xdist) runs it in one process."""
    if (not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER")
            or config.option.numprocesses is not None or config.getoption("usepdb", False)
            or torch.cuda.is_available() or (os.cpu_count() or 1) < 2):
        return
    config.option.numprocesses, config.option.dist = "auto", "loadfile"


# The longest test files (about 15-80 s each on 2 cores), longest first: started first, they do not
# leave one worker running alone at the end (xdist hands out files in collection order).
LONGEST_FILES = ("test_pipeline.py", "serve/test_server.py", "reference/test_greedy.py", "sweep/test_sweep_apis.py",
                 "serve/test_engine_runners.py", "reference/test_bad_words.py", "serve/test_openai.py",
                 "reference/test_sampling.py", "serve/test_dialect_server.py", "reference/test_draft_len.py",
                 "serve/test_upstream_clients.py", "serve/test_tp_server.py", "reference/test_dflash2_loop.py",
                 "sweep/test_bands_sweep.py", "reference/test_laguna.py", "project/test_project_cmd.py")


def _file_rank(item) -> int:
    path = item.nodeid.split("::")[0].removeprefix("tests/")
    return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)


# The parity lanes run NVIDIA's containers' Python, 3.12, on the tritonserver nvidia-pytriton 0.7.0
# bundles (python_backend r24.10). Its stub frees response tensors on threads that do not hold the
# GIL, which Python 3.12 turns into a segfault that kills a model's stub mid-stream ("Stub process
# 'dflash_0_0' is not healthy"; fixed by triton-inference-server/python_backend PR #390, r25.01,
# which NVIDIA's containers carry; serve/dialect_model.py _Graveyard works round the BLS half).
# In those lanes a test that starts this bundled server in-process is skipped; the main lane
# (Python 3.11) serves every one of them.
BUNDLED_STUB_CRASHES = bool(os.environ.get("TRTLLM_DFLASH_LANE")) and sys.version_info >= (3, 12)


@pytest.fixture(autouse=True, scope="session")
def _bundled_tritonserver_in_the_lanes():
    if not BUNDLED_STUB_CRASHES:
        yield
        return
    from trtllm_dflash.launch.server import TritonServer

    def start(self, *args, **kwargs):
        pytest.skip("the bundled tritonserver's Python 3.12 stub crashes (python_backend PR #390); "
                    "served in the main lane")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TritonServer, "start", start)
        yield


def pytest_collection_modifyitems(config, items):
    items.sort(key=_file_rank)  # stable: a file's own order is kept
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
