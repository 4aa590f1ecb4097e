"""NVIDIA's container images each GPU backend runs in: the one place that names them.

Names without a registry: they live on NVIDIA's registry NGC, `nvcr.io` (not Docker Hub); the
cluster launchers put NVIDIA_REGISTRY in front, or the mirror `serve --registry` names
(launch/cluster.py). Facts, with their upstream sources: docs/design/upstream-facts.md:
- engine backend: Triton 25.12 `trtllm-python-py3` (TensorRT-LLM 1.2.1, TensorRT 10.14; the
  Triton image line 25.12-26.07 all carry 1.2.1, the last TensorRT-LLM with `trtllm-build`);
- pytorch backend behind trtllm-serve: TensorRT-LLM's release image of the recipe's version
  (`nvidia/tensorrt-llm/release:<x.y.z>`, what NVIDIA's deployment guides run);
- pytorch backend behind Triton (the LLM-API model): a `tritonserver:<yy.mm>-trtllm-python-py3`
  whose TensorRT-LLM is >= 1.3; no such image was found (every Triton image up to 26.07 carries
  1.2.1), so none is named and the user must give one.
"""

from __future__ import annotations

from trtllm_dflash.recipe.support import BACKENDS, backend as backend_spec

NVIDIA_REGISTRY = "nvcr.io"  # NGC's container registry: `nvcr.io/nvidia/...`
TRITON_TRTLLM_1_2 = next(b.image for b in BACKENDS.values() if b.builds_engines)
TRTLLM_RELEASE = next(b.image for b in BACKENDS.values() if b.static_schedule).split(":")[0]


def backend_image(backend: str, api: str, trtllm_version: str | None) -> str | None:
    """The image that serves `backend` through `api` ("triton" or "openai"), None when no
    published image is known to carry what it needs."""
    spec = backend_spec(backend)
    if spec.image is None or api not in spec.image_apis:
        return None  # e.g. the pytorch backend behind Triton's LLM-API backend: no published image carries it
    return spec.image.format(version=trtllm_version or spec.default_trtllm_version)
