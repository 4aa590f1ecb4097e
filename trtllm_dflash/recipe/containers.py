"""NVIDIA's container images each GPU backend runs in: the one place that picks them, from the
image table (recipe/images.py, recipe/catalog/images.yaml: what each image carries, read from
upstream's own files).

Names without a registry: they live on NVIDIA's registry NGC, `nvcr.io` (not Docker Hub); the
cluster launchers put NVIDIA_REGISTRY in front, or the mirror `serve --registry` names
(launch/cluster.py).
- engine backend: the newest Triton `trtllm-python-py3` image carrying TensorRT-LLM 1.2.1, the
  last TensorRT-LLM with `trtllm-build` (Triton 26.04-26.07 carry TensorRT-LLM 1.2.1;
  25.12-26.02 carry 1.1.0, 26.03 1.2.0rc8; no Triton image after 26.07 has a TensorRT-LLM backend);
- pytorch backend behind trtllm-serve: TensorRT-LLM's release image of the recipe's version
  (`nvidia/tensorrt-llm/release:<x.y.z>`, what NVIDIA's deployment guides run);
- pytorch backend behind Triton (the LLM-API model): no Triton image carries TensorRT-LLM >= 1.3,
  so none is named and the user must give one.
A recipe's `backend.image` replaces the default; `check` refuses one the table knows to carry the
wrong TensorRT-LLM.
"""

from __future__ import annotations

from trtllm_dflash.recipe import images
from trtllm_dflash.recipe.support import BACKENDS
from trtllm_dflash.recipe.support import backend as backend_spec

NVIDIA_REGISTRY = images.REGISTRY  # NGC's container registry: `nvcr.io/nvidia/...`
TRITON_TRTLLM_1_2 = next(b.image for b in BACKENDS.values() if b.builds_engines)
TRTLLM_RELEASE = next(b.image for b in BACKENDS.values() if b.static_schedule).split(":")[0]


def backend_image(backend: str, api: str, trtllm_version: str | None, pinned: str | None = None) -> str | None:
    """The image that serves `backend` through `api` ("triton" or "openai"), without its registry:
    the recipe's own (`pinned`, backend.image), else the backend's default; None when no published
    image is known to carry what it needs."""
    if pinned:
        return pinned.split("/", 1)[1] if pinned.startswith(NVIDIA_REGISTRY + "/") else pinned
    spec = backend_spec(backend)
    if spec.image is None or api not in spec.image_apis:
        return None  # e.g. the pytorch backend behind Triton's LLM-API backend: no published image carries it
    return spec.image.format(version=trtllm_version or spec.default_trtllm_version)
