"""Shared test configuration.

Markers (declared in pyproject.toml):
- slow: long-running, excluded from the default run; `pytest -m slow` runs them.
- gpu: needs an NVIDIA GPU; skipped here with the reason.
"""

import gc
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

# Python's full garbage collections walk every tracked object, and torch, transformers and the
# collected tests are millions of them: they took 40% of collection (no cached bytecode here:
# PYTHONDONTWRITEBYTECODE, so pytest rewrites every test module's asserts anew) and 3-6 s per
# worker after it (docs/results/suite-time.md). So what exists at start-up, after collection and
# when each module's first test starts is frozen, and collections walk only what came since. The
# price: garbage in a cycle when a module starts is never freed (a worker's peak stays ~1.3 GB).
gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    gc.disable()  # collection makes little garbage, and its full collections found none worth the time
    yield
    gc.freeze()
    gc.enable()


_module_frozen = [None]


def pytest_runtest_setup(item):
    if item.module is not _module_frozen[0]:
        _module_frozen[0] = item.module
        gc.freeze()


@pytest.fixture(autouse=True)
def _torch_threads():
    """Every test leaves torch's thread count as it found it. Commands and benches set their own in
    process (`bench policy --threads 2`, a server's cpu_torch_threads); left behind in a worker,
    2 threads beside the other worker's crawl on 2 cores for the rest of that worker's tests."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into workers
def pytest_cmdline_main(config):
    """With pytest-xdist installed and no -n given, the suite runs on every core (-n auto), one
    test file per worker at a time (a file's module fixtures and servers stay in one process;
    see pytest_xdist_make_scheduler). Not on a CUDA machine, whose tests share its one device,
    and not under --pdb. -n 0 (or -p no:xdist) runs it in one process."""
    if (not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER")
            or config.option.numprocesses is not None or config.getoption("usepdb", False)
            or torch.cuda.is_available() or (os.cpu_count() or 1) < 2):
        return
    config.option.numprocesses, config.option.dist = "auto", "loadfile"


# Test files that share one session fixture go to the same worker, as one unit: each worker that
# ran one of them would otherwise build the fixture again (tests/serve/conftest.py default_served:
# a convert, a deploy and a tritonserver, about 15 s on 2 busy cores).
SHARED_FIXTURE_UNITS = {
    "default_served": ("serve/test_server.py", "serve/test_dialect_server.py", "serve/test_upstream_clients.py",
                       "serve/test_client_wire.py", "serve/test_dynamo.py"),
    "embedded_run": ("serve/test_openai.py", "commands/test_profile.py"),
}
# The longest units of the default run (5-45 s each on a quiet 2-core machine, from its JUnit
# report), longest first: started first, they do not leave one worker running alone at the end.
LONGEST_UNITS = ("default_served", "embedded_run", "runtime/test_engine_runners.py", "reference/test_greedy.py",
                 "project/test_project_cmd.py", "serve/test_engine_server.py", "reference/test_sampling.py",
                 "test_pipeline.py", "plugins/test_kv_inject_kernel.py", "commands/test_commands.py",
                 "policy/test_draft_len.py", "reference/test_bad_words.py", "reference/test_dflash2_loop.py",
                 "reference/test_batch.py", "serve/test_batcher.py", "runtime/test_mpi_ranks.py")


def _unit(nodeid: str) -> str:
    """The scheduling unit of a test: its file, or the shared-fixture unit its file belongs to."""
    path = nodeid.split("::")[0].removeprefix("tests/")
    return next((name for name, files in SHARED_FIXTURE_UNITS.items() if path in files), path)


def _unit_rank(item) -> int:
    unit = _unit(item.nodeid)
    return LONGEST_UNITS.index(unit) if unit in LONGEST_UNITS else len(LONGEST_UNITS)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown when it is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """xdist's per-file scheduling with two changes: the files of a shared-fixture unit go to one
    worker together, and units are handed out in collection order (longest first, see
    pytest_collection_modifyitems) instead of xdist's default, most tests first."""
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    if config.option.dist != "loadfile":
        return None
    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


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
    items.sort(key=_unit_rank)  # stable: a file's own order is kept
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


@pytest.fixture(scope="session")
def qwen3_pair(tmp_path_factory):
    """A tiny random Qwen3 target and its drafter on disk (reference_helpers)."""
    from reference_helpers import make_drafter, make_target

    root = tmp_path_factory.mktemp("qwen3_pair")
    t = make_target(root / "target", "qwen3")
    return t, make_drafter(root / "drafter", t)


@pytest.fixture(scope="session")
def llama_pair(tmp_path_factory):
    """A tiny random Llama target and its drafter on disk (reference_helpers)."""
    from reference_helpers import make_drafter, make_target

    root = tmp_path_factory.mktemp("llama_pair")
    t = make_target(root / "target", "llama", seed=1)
    return t, make_drafter(root / "drafter", t, seed=1, target_layer_ids=(1, 3))
