"""One rank of tests/runtime/test_mpi_ranks.py, started by a real `mpirun -n 2` with SLURM_PROCID=0
in its environment (what `srun -n1 mpirun -n2` gives every child): opens a tp 2 split-drafter
build with runtime/trt_runners.py open_trt_engine over the CUDA / TensorRT / Executor stand-ins
(fake_cuda, fake_bindings; the Executor's rank is this process's real MPI rank, as TensorRT-LLM's
C++ Executor takes it from MPI) and prints one JSON line: the MPI rank, the rank our code derived,
the GPU it made current and the drafter engine file it opened."""

import json
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

import fake_bindings
import fake_cuda
from trtllm_dflash.runtime import trt_runners

SHAPES = {"k_cache_0": (-1, -1, 1, 64), "draft_logits": (-1, -1, 4096)}
DTYPES = {"ctx_rows": "BF16", "k_cache_0": "BF16"}


class Stop:
    """The split drafter's rank group, rank 0 having said stop at once (runtime/drafter_ranks.py)."""

    def __init__(self, rank, world, device):
        self.rank, self.world, self.device = rank, world, device

    def recv(self):
        return ("stop", 0)


def main(build: str) -> None:
    seen = {"mpi_rank": MPI.COMM_WORLD.Get_rank()}
    with pytest.MonkeyPatch.context() as mp:
        cuda = fake_cuda.install(mp, 2, SHAPES, DTYPES)
        b = fake_bindings.module()
        b.Executor = lambda *a, **k: fake_bindings.Executor(*a, world_rank=seen["mpi_rank"], **k)

        class Session(trt_runners.TrtSession):
            def __init__(self, engine_dir, device="cuda", rank=0, peers=()):
                seen["engine"] = str(Path(engine_dir) / f"rank{rank}.engine")
                super().__init__(engine_dir, device, rank, peers)

        model = trt_runners.open_trt_engine(build, bindings=b, session_cls=Session, rank_group=Stop)
        seen.update(derived=trt_runners.mpi_rank(), current=cuda.current, role=type(model).__name__)
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
