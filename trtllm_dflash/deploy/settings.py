"""The dflash model's settings: what deploy writes into its config.pbtxt parameters and what serve
(the Triton model, `serve --api openai`, `profile`) reads back, as one typed record.

Each setting has exactly one default, here. Triton hands a Python model its parameters as
strings; `to_params` and `from_params` are the only code that turns them into values and back
(tests/deploy/test_settings.py: every key deploy writes is read, and every key serve reads is
one deploy can write). The deployed recipe (`recipe`, beside model.py) carries everything else
a server needs: block size, draft lengths, batch limits, tensor parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.planner import KV_CACHE_FREE_GPU_MEM_FRACTION
from trtllm_dflash.runtime import RUNNERS

# Settings that name directories: relative to the deploy output (the directory holding
# model_repository/ and manifest.json), resolved by `resolved` where the deployment is opened.
PATHS = ("checkpoint", "engine_dir")


@dataclass(frozen=True)
class ModelSettings:
    recipe: str = "recipe.yaml"  # the deployed recipe, in the model's version directory
    runners: str = "reference"  # what decodes: our torch modules, the CPU engine stand-ins, TensorRT engines
    checkpoint: str | None = None  # the convert / quantize output served (reference and emulated runners)
    checkpoint_manifest_sha256: str | None = None  # its manifest.json at deploy time
    engine_dir: str | None = None  # the build output (tensorrt runners)
    kv_cache_free_gpu_mem_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION  # tensorrt runners' KV pool
    gpu_device_ids: str | None = None  # tensorrtllm_backend's form, "0,1"; None: the GPUs in order
    torch_threads: int = 0  # 0: serve/deployed.default_torch_threads (CPU: every core but one)

    def __post_init__(self):
        if self.runners not in RUNNERS:
            raise UserError(f"runners: {self.runners!r}, allowed: {', '.join(RUNNERS)}")
        if not 0 < self.kv_cache_free_gpu_mem_fraction <= 1:
            raise UserError(f"kv_cache_free_gpu_mem_fraction: {self.kv_cache_free_gpu_mem_fraction}, expected 0 < f <= 1")
        if self.torch_threads < 0:
            raise UserError(f"torch_threads: {self.torch_threads}, expected >= 0 (0: the deployment's default)")

    def resolved(self, deploy_dir: Path) -> "ModelSettings":
        """These settings with their paths made absolute against `deploy_dir` (an absolute path,
        as older deployments wrote, stays as it is)."""
        return replace(self, **{k: str((Path(deploy_dir) / v).resolve()) for k in PATHS if (v := getattr(self, k))})

    def to_params(self) -> dict[str, str]:
        """config.pbtxt parameters, as strings: every setting that is set (operators edit them there,
        as tensorrtllm_backend's users do)."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_params(cls, params: dict[str, str], where: str = "config.pbtxt") -> "ModelSettings":
        """The settings of a model's parameters (strings, as Triton gives them). A key this version
        does not know is refused by name: it was written by another version of deploy, or by hand."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise UserError(f"{where}: parameter {unknown[0]!r} is not a dflash model setting (known: "
                            f"{', '.join(known)}); deploy again with this version")
        values = {}
        for key, text in params.items():
            kind = known[key].type
            try:
                values[key] = float(text) if "float" in kind else int(text) if kind == "int" else text
            except ValueError:
                raise UserError(f"{where}: parameter {key}: {text!r} is not a{'n integer' if kind == 'int' else ' number'}") from None
        return cls(**values)
