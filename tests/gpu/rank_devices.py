"""One rank of tests/gpu/test_gpu_first_dgx.py's tp 2 check, started by `mpirun -n 2 python
rank_devices.py BUILD_DIR`: opens the build with open_trt_engine as a deployment's rank does and
prints one JSON line with the CUDA device its drafter engine's stream, its all-reduce workspace
and the rank's current device were on (they must all be the rank's GPU)."""

import json
import sys

import torch

from trtllm_dflash.runtime.trt_runners import TrtSession, mpi_rank, open_trt_engine

SEEN: dict = {}


class RecordingSession(TrtSession):
    """TrtSession, recording where it put its stream and all-reduce workspace."""

    def _all_reduce_workspace(self, tp, rank, peers):
        SEEN["workspace"] = torch.cuda.current_device()  # IpcMemory's cudaMalloc goes to the current device
        return super()._all_reduce_workspace(tp, rank, peers)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        SEEN["stream"] = self.stream.device.index


def main(build_dir: str) -> None:
    model = open_trt_engine(build_dir, session_cls=RecordingSession)
    SEEN.update(rank=mpi_rank(), current=torch.cuda.current_device())
    print(json.dumps(SEEN), flush=True)
    if hasattr(model, "serve"):  # a worker rank: waits in the drafter loop until rank 0 closes
        model.serve()
    else:
        model.close()


if __name__ == "__main__":
    main(sys.argv[1])
