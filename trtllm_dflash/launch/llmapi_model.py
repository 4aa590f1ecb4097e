"""TensorRT-LLM's Triton LLM-API model files in a pytorch deployment served by Triton.

deploy writes the pytorch backend's `model_repository/<name>/config.pbtxt` and `1/model.yaml`;
the Python that reads them is TensorRT-LLM's own `model.py` and the `helpers.py` it imports
(triton_backend/all_models/llmapi/tensorrt_llm/1/ of the TensorRT-LLM release the server runs),
which must match the installed tensorrt_llm. So every launch line of `serve --api triton` copies
them into the deployed `<name>/1/` inside the container before tritonserver starts: from the
directory `serve --llmapi-model DIR` names, else from `$TRTLLM_LLMAPI_MODEL_DIR`, which
docs/docker/triton-trtllm-llmapi.Dockerfile sets to the model of its release. Without either the
launch stops in one line. The copy goes to a temporary name and is renamed: ranks and replicas
that copy the same file onto shared storage never leave a half-written one.

Multi-rank launches (mpirun, srun, or k8s with several ranks per model copy, every rank under
trtllm-llmapi-launch: rank 0 runs tritonserver, whose model.py hands MPI COMM_WORLD to the LLM)
need the MPI environment in the Python backend. The newer upstream model.py (main line at
044a90d) deletes the MPI job variables (OMPI_COMM_WORLD_*, PMIX_*, PMI_*) at import, for a fresh
MPI in the workers a single-process LLM spawns; rank 0's model then starts an LLM of its own and
the other ranks never join. The launch step detects that model.py (`CLEARS_MPI`) and refuses the
multi-rank launch, naming the two that work with it.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError

MODEL_DIR_ENV = "TRTLLM_LLMAPI_MODEL_DIR"  # the LLM-API model directory (holds 1/model.py) in the image
FILES = ("model.py", "helpers.py")  # what the version directory needs beside model.yaml

# A model.py that clears the MPI job environment: OMPI_COMM_WORLD_RANK as an element of a literal
# collection (after '{', ',' or at a line's start: not an argument of environ.get / environ[...]),
# and a deletion from os.environ. Both must hold (grep -E).
RANK_IN_A_SET = r"""(^|[{,])[[:space:]]*['"]OMPI_COMM_WORLD_RANK['"]"""
DELETES_ENV = r"""del[[:space:]]+os\.environ\[|os\.environ\.pop\(|os\.unsetenv\("""
ALTERNATIVES = ("serve with --launcher single_node (one tritonserver; the LLM spawns its ranks on one node) or "
                "--api openai (trtllm-serve under trtllm-llmapi-launch)")


def clears_mpi_test(model_py: str) -> str:
    """A shell condition, true when the model.py at `model_py` (a shell word) clears the MPI environment."""
    return (f"grep -Eq {shlex.quote(RANK_IN_A_SET)} {model_py} && grep -Eq {shlex.quote(DELETES_ENV)} {model_py}")


def _refusal(model_py: str) -> str:
    return (f"{model_py}: this TensorRT-LLM model.py deletes the MPI environment at import (OMPI_COMM_WORLD_*, "
            "PMIX_*, PMI_*), so ranks started by trtllm-llmapi-launch never join rank 0; " + ALTERNATIVES)


@dataclass(frozen=True)
class LLMAPIModel:
    """Where the model files go and come from."""

    version_dir: Path  # the deployment's model_repository/<name>/1
    source: Path | None = None  # --llmapi-model DIR (holds 1/model.py); None: $TRTLLM_LLMAPI_MODEL_DIR

    def prelude(self, multi_rank: bool) -> list[str]:
        """Shell statements: copy the files in (or stop in one line), and for a multi-rank launch
        stop when the model.py clears the MPI environment."""
        to = shlex.quote(str(self.version_dir))
        src = shlex.quote(str(self.source)) if self.source else f'"${{{MODEL_DIR_ENV}:-}}"'
        where = f"--llmapi-model {self.source}" if self.source else f"${MODEL_DIR_ENV}"
        missing = (f"trtllm-dflash: no TensorRT-LLM LLM-API model in {where} (it needs 1/model.py and 1/helpers.py); "
                   f"pass serve --llmapi-model DIR (triton_backend/all_models/llmapi/tensorrt_llm of the TensorRT-LLM "
                   f"in the image) or set {MODEL_DIR_ENV} (docs/docker/triton-trtllm-llmapi.Dockerfile does)")
        lines = [f"src={src}",
                 '[ -n "$src" ] && [ -f "$src/1/model.py" ] && [ -f "$src/1/helpers.py" ] || '
                 f"{{ echo {shlex.quote(missing)} >&2; exit 1; }}",
                 f'for f in {" ".join(FILES)}; do cp "$src/1/$f" {to}/".$f.$$"; mv -f {to}/".$f.$$" {to}/"$f"; done']
        if multi_rank:
            refusal = shlex.quote(f"trtllm-dflash: {_refusal(str(self.version_dir / 'model.py'))}")
            lines.append(f"if {clears_mpi_test(f'{to}/model.py')}; then echo {refusal} >&2; exit 1; fi")
        return lines

    def wrapped(self, cmd: list[str], multi_rank: bool) -> list[str]:
        """`cmd` after the prelude, as one bash command."""
        return ["bash", "-c", "; ".join(["set -eu", *self.prelude(multi_rank), f"exec {shlex.join(cmd)}"])]

    def check_here(self, multi_rank: bool) -> None:
        """--llmapi-model DIR on this machine: refuse now what the launch step would refuse later."""
        if self.source is None:
            return
        missing = [f for f in FILES if not (self.source / "1" / f).is_file()]
        if missing:
            raise UserError(f"--llmapi-model {self.source}: no 1/{' or 1/'.join(missing)}; give TensorRT-LLM's "
                            "triton_backend/all_models/llmapi/tensorrt_llm of the version the image runs")
        model_py = self.source / "1" / "model.py"
        if multi_rank and subprocess.run(["bash", "-c", clears_mpi_test(shlex.quote(str(model_py)))]).returncode == 0:
            raise UserError(f"--llmapi-model {_refusal(str(model_py))}")
