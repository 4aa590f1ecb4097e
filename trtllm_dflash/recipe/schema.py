"""The recipe schema: one typed YAML that drives every stage.

Pydantic sections with unknown keys rejected (`extra="forbid"`), and the recipe reference
(docs/recipe-reference.md) generated from the same sections. The reader (`parse_recipe`: YAML, overrides,
schema, architecture facts) is reader.py; cross-field rules live in rules.py;
`load.load_recipe` runs both. Every problem is a `RecipeError` naming the file and the
dotted field, the bad value and what is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from trtllm_dflash.errors import UserError
from trtllm_dflash.policy.bands import band_draft_len
from trtllm_dflash.recipe.hardware import Format, GpuSpec, hardware_catalog
from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.models_root import MODELS_ROOT_ENV, hub_download  # noqa: F401 (MODELS_ROOT_ENV: re-exported)
from trtllm_dflash.recipe.support import NATIVE_ONLY, BackendName

BUILTIN_PREFIX = "builtin:"


class RecipeError(UserError):
    """One or more problems in a recipe; the message has one line per problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Section):
    gpu: str = Field(description="device from the hardware catalog: h100-sxm, h200, b200, b300, cpu")
    count: int = Field(default=1, ge=1, description="devices used by this deployment; more than a node's (pytorch "
                       "backend only) spans whole nodes (`serve --launcher srun` or `k8s`)")


class ModelSource(_Section):
    source: str = Field(
        description="local directory (relative to the recipe), 'builtin:NAME' for shipped assets, or an HF id"
    )
    arch: str | ArchFacts | None = Field(
        default=None,
        description="catalog name, inline facts, or omitted to read config.json from a local source",
    )
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def is_local(self) -> bool:
        s = self.source
        return s.startswith((BUILTIN_PREFIX, "/", "./", "../", "~")) or Path(self._base_dir, s).exists()

    @property
    def path(self) -> Path | None:
        """The resolved local directory; for an HF id its download under the models root or in the
        local Hugging Face cache (hub_download), None when neither has it."""
        s = self.source
        if s.startswith(BUILTIN_PREFIX):
            return Path(str(resources.files("trtllm_dflash").joinpath("assets", s[len(BUILTIN_PREFIX) :])))
        if not self.is_local:
            return hub_download(s)
        return (self._base_dir / Path(s).expanduser()).resolve()


FLOAT_FORMATS = ("fp32", "bf16", "fp16")


class Quantization(_Section):
    target_weights: Format = Field(default="bf16", description="target linear-layer weights")
    activations: Format = Field(default="bf16", description="target GEMM inputs")
    kv_cache: Format = Field(default="bf16", description="target KV cache (and the engine drafter's context cache)")
    drafter: Format = Field(default="bf16", description="drafter linear-layer weights")
    max_acceptance_drop: float = Field(
        default=0.10, ge=0.0, le=1.0,
        description="quantize fails when the quantized checkpoint's tau on the guard prompts is lower than the "
        "unquantized one's by more than this fraction of it (1 = never fails; the numbers are recorded either way)")
    calib_samples: int = Field(default=32, ge=1,
                               description="calibration sequences quantize runs (`quantize --calib-samples`)")
    calib_len: int = Field(default=256, ge=8, description="tokens per calibration sequence (`quantize --calib-len`)")

    @property
    def formats(self) -> dict[str, str]:
        """The format fields (not the calibration settings or the acceptance guardrail's threshold)."""
        return {f: getattr(self, f) for f in ("target_weights", "activations", "kv_cache", "drafter")}

    @property
    def quantizes(self) -> bool:
        """True when the quantize stage runs: the target or the drafter weights are in a quantized
        format, or the KV cache is (its scales come from calibration; convert writes none, and a
        TensorRT-LLM checkpoint without kv_cache_quant_algo builds no FP8 KV cache). Target weights
        in a native format (NATIVE_ONLY: gpt-oss's MXFP4) are served as the checkpoint ships them."""
        target = self.target_weights not in FLOAT_FORMATS + NATIVE_ONLY
        return target or any(f not in FLOAT_FORMATS for f in (self.drafter, self.kv_cache))

    def checkpoint_dtype(self, role: Literal["target", "drafter"]) -> str:
        """The high-precision format a model's checkpoint keeps (convert's output, and every tensor
        quantize leaves unquantized): its weight format when that is a float format, else the
        activation format when that is, else bf16."""
        fmt = self.target_weights if role == "target" else self.drafter
        if fmt in FLOAT_FORMATS:
            return fmt
        return self.activations if self.activations in FLOAT_FORMATS else "bf16"


class Parallel(_Section):
    tp: int = Field(default=1, ge=1, description="tensor parallel ranks (on cpu: worker processes)")
    pp: int = Field(default=1, ge=1, description="pipeline parallel stages")
    replicas: int = Field(
        default=1, ge=1, description="data-parallel copies of the tp x pp model, each its own server on its own "
        "GPUs, behind one endpoint (hardware.count = replicas x tp x pp): how a model that fits one node scales out")
    drafter: Literal["auto", "rank0", "split"] = Field(
        default="auto", description="engine backend at tp > 1: where the drafter runs; auto = the placement rule "
        "(docs/engine-tp.md), rank0 = the whole drafter on rank 0's GPU, split = tensor-parallel like the target")


class Backend(_Section):
    name: BackendName = Field(description="reference (PyTorch, CPU or GPU), engine (TensorRT-LLM 1.2.x engines + our "
                                          "plugin), pytorch (TensorRT-LLM >= 1.3 native DFlash)")
    trtllm_version: str | None = Field(
        default=None, description="TensorRT-LLM version in the container (engine: 1.2.x; pytorch: >= 1.3)"
    )
    image: str | None = Field(
        default=None, description="the container image the deployment runs in (default: the backend's NVIDIA image, "
        "recipe/catalog/images.yaml); check refuses one the image table knows to carry another TensorRT-LLM")
    drafter_attention: Literal["auto", "VANILLA", "TRTLLM", "FA4"] = Field(
        default="auto", description="pytorch backend: the drafter's attention_backend; auto = TRTLLM on Blackwell, "
        "VANILLA elsewhere (FA4 only when asked: it needs the flash-attn-4 package in the container)")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v


class Build(_Section):
    max_batch_size: int = Field(default=64, ge=1, description="largest number of sequences in flight")
    max_input_len: int = Field(default=4096, ge=1, description="longest prompt, tokens")
    max_seq_len: int = Field(default=8192, ge=2, description="longest prompt + output, tokens")
    max_num_tokens: int = Field(default=8192, ge=1, description="tokens per forward pass (prefill chunks + drafts)")
    kv_cache_reuse: bool | None = Field(
        default=None, description="engine backend: KV-cache block reuse across verify rounds (needs paged context "
        "FMHA in the target engine); null = wherever the engine layout allows it, true = required (check refuses a "
        "layout that cannot honour it), false = off")


class DraftBand(_Section):
    max_concurrency: int = Field(ge=1, description="band applies up to this many sequences in flight")
    draft_len: int = Field(ge=0, description="draft tokens per round in this band (0 = speculation off)")


class Speculative(_Section):
    block_size: int = Field(default=16, ge=2, le=32, description="DFlash block: anchor + block_size-1 drafts")
    draft_len: list[DraftBand] | Literal["auto"] = Field(
        default_factory=list,
        description="draft length per concurrency band (empty = block_size-1 everywhere), or 'auto': chosen each "
        "round from live acceptance and the measured verify cost (reference and engine backends)",
    )
    ddtree_budget: int | None = Field(default=None, ge=1, le=1024, description="DDTree node budget (optional)")

    @property
    def auto(self) -> bool:
        return self.draft_len == "auto"

    @property
    def bands(self) -> list[DraftBand]:
        """The static bands ([] with `auto` or none given)."""
        return [] if self.auto else list(self.draft_len)

    @property
    def band_pairs(self) -> list[tuple[int, int]]:
        """The static bands as [(max_concurrency, draft_len)], the form policy/bands.py reads."""
        return [(b.max_concurrency, b.draft_len) for b in self.bands]

    def draft_len_at(self, concurrency: int) -> int:
        """The static draft length at `concurrency` (block_size - 1 without bands, and under `auto`)."""
        return band_draft_len(self.band_pairs, concurrency, self.block_size)


def same_ports(http_port: int, grpc_port: int, metrics_port: int) -> str | None:
    """What is wrong when two of Triton's three ports are equal, else None (tritonserver given one
    port twice prints its usage and exits 1, naming neither)."""
    named = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    for (a, x), (b, y) in itertools.combinations(named.items(), 2):
        if x == y:
            return f"{a} and {b} are both {x}; Triton needs three different ports"
    return None


class Serve(_Section):
    model_name: str = Field(default="dflash", pattern=r"^[A-Za-z0-9_.-]+$", description="Triton model name")
    host: str = Field(default="127.0.0.1", description="bind address")
    http_port: int = Field(default=8000, ge=1, le=65535, description="Triton HTTP port")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton gRPC port")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton Prometheus metrics port")
    instances: int = Field(default=1, ge=1, description="model instances")
    decoupled: bool = Field(default=True, description="decoupled (streaming) transaction policy")

    @model_validator(mode="after")
    def _different_ports(self) -> "Serve":
        clash = same_ports(self.http_port, self.grpc_port, self.metrics_port)
        if clash:
            raise ValueError(clash)
        return self


class Sweep(_Section):
    concurrency: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], min_length=1, description="concurrency levels, increasing"
    )
    input_len: int = Field(default=1024, ge=1, description="prompt tokens (random dataset)")
    output_len: int = Field(default=1024, ge=1,
                            description="output tokens per request (the mean, with output_len_range)")
    output_len_range: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="request i asks for output_len x (1 + u_i x range) tokens, u_i uniform in [-1, 1] (seeded, the "
                    "same for every curve); 0: all ask output_len, which keeps AR's requests in lockstep "
                    "(docs/design/draft-length-policy.md)",
    )
    dataset: str = Field(default="random", description="'random', 'builtin:NAME' or a JSONL of prompts")
    requests_factor: int = Field(default=5, ge=5, description="requests per level = factor x concurrency")
    min_requests: int = Field(default=8, ge=1, description="at least this many requests per level")
    warmup_requests: int = Field(default=2, ge=0, description="per level, excluded from the metrics")
    seed: int = Field(default=0, description="seed for prompts and sampling")

    @field_validator("concurrency")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v) or v != sorted(set(v)):
            raise ValueError(f"must be strictly increasing positive integers, got {v}")
        return v

    def requests_at(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_factor * concurrency)

    @property
    def max_output_len(self) -> int:
        """The longest output a request asks for."""
        return self.output_len + int(self.output_len * self.output_len_range)

    def output_lens(self, n: int) -> list[int]:
        """max_tokens of requests 0..n-1 (`output_len_range`), at least 1 each."""
        g = random.Random(f"output_len:{self.seed}")
        spread = int(self.output_len * self.output_len_range)
        return [max(1, self.output_len + (g.randint(-spread, spread) if spread else 0)) for _ in range(n)]


class Recipe(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="deployment name (letters, digits, _ . -)")
    description: str = Field(default="", description="one line for humans")
    hardware: Hardware
    target: ModelSource
    drafter: ModelSource
    quantization: Quantization = Quantization()
    parallel: Parallel = Parallel()
    backend: Backend
    build: Build = Build()
    speculative: Speculative = Speculative()
    serve: Serve = Serve()
    sweep: Sweep = Sweep()

    _file: Path | None = PrivateAttr(default=None)
    _positions: Any = PrivateAttr(default=None)  # reader.py: positions.Positions of the file it was read from
    _target_facts: ArchFacts | None = PrivateAttr(default=None)
    _drafter_facts: ArchFacts | None = PrivateAttr(default=None)

    @property
    def file(self) -> Path | None:
        return self._file

    def field_at(self, field: str) -> str:
        """`field` with the YAML line and column it was written at (or the --set that set it), for
        the start of an error line about it."""
        return self._positions.at(field) if self._positions is not None else f"{self._file}: {field}"

    @property
    def gpu(self) -> GpuSpec:
        return hardware_catalog()[self.hardware.gpu]

    @property
    def target_facts(self) -> ArchFacts:
        assert self._target_facts is not None, "load the recipe with load_recipe()"
        return self._target_facts

    @property
    def drafter_facts(self) -> ArchFacts:
        assert self._drafter_facts is not None, "load the recipe with load_recipe()"
        return self._drafter_facts

    @property
    def world_size(self) -> int:
        """The ranks of one model copy (tp x pp); `parallel.replicas` copies serve side by side."""
        return self.parallel.tp * self.parallel.pp

    def sha256(self) -> str:
        """Content hash of the validated recipe (for stage manifests)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


# ----------------------------------------------------------------------------- docs


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    args = get_args(annotation)
    if get_origin(annotation) is list:
        return f"list[{_type_name(args[0])}]"
    if args:
        named = " \\| ".join(_type_name(a) for a in args if a is not type(None))
        return named + (" \\| null" if type(None) in args else "")
    return getattr(annotation, "__name__", str(annotation))


def recipe_reference_markdown() -> str:
    """docs/recipe-reference.md, generated from the typed sections (one source of truth)."""
    lines = ["| field | type | default | meaning |", "|---|---|---|---|"]
    top = Recipe.model_fields
    for name, field in top.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann is not ModelSource:
            for sub, f in ann.model_fields.items():
                default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
                lines.append(f"| `{name}.{sub}` | {_type_name(f.annotation)} | `{default}` | {f.description or ''} |")
        elif ann is ModelSource:
            for sub, f in ModelSource.model_fields.items():
                default = "required" if f.is_required() else repr(f.get_default())
                kind = "str \\| facts" if sub == "arch" else "str"
                lines.append(f"| `{name}.{sub}` | {kind} | `{default}` | {f.description or ''} |")
        else:
            default = "required" if field.is_required() else repr(field.get_default())
            lines.append(f"| `{name}` | {_type_name(ann)} | `{default}` | {field.description or ''} |")
    return "\n".join(lines)
