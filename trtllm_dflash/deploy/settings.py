"""The contract between deploy and serve, the only part of deploy that serve imports: where a
deployment keeps its model repository, the dflash model's request and response tensors
(config.pbtxt declares them; serve/triton_model.py reads requests, serve/triton_outputs.py renders
responses) and its settings.

The settings: what deploy writes into the dflash model's config.pbtxt parameters and what serve
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

from tritonclient.grpc import model_config_pb2 as mc

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.plan.rows import KV_CACHE_FREE_GPU_MEM_FRACTION
from trtllm_dflash.runtime import RUNNERS

REPOSITORY = "model_repository"  # the Triton model repository inside a deploy output


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: int  # a model_config_pb2.DataType value
    dims: tuple[int, ...] = (1,)
    optional: bool = False
    doc: str = ""  # what it is (an output of ours: the dialect models' docs table says it)


# Requests of the dflash model (one prompt per request; Triton batching off, the engine batches in flight).
DFLASH_INPUTS = (
    Tensor("text_input", mc.TYPE_STRING, optional=True),  # required unless input_ids is given
    Tensor("max_tokens", mc.TYPE_INT32),
    Tensor("input_ids", mc.TYPE_INT32, (-1,), optional=True),  # a tokenized prompt instead of text_input
    Tensor("end_id", mc.TYPE_INT32, optional=True),  # the token that ends this request (default: the target's eos)
    Tensor("temperature", mc.TYPE_FP32, optional=True),
    Tensor("top_p", mc.TYPE_FP32, optional=True),
    Tensor("top_k", mc.TYPE_INT32, optional=True),
    Tensor("seed", mc.TYPE_UINT64, optional=True),
    Tensor("stop_words", mc.TYPE_STRING, (-1,), optional=True),
    Tensor("stream", mc.TYPE_BOOL, optional=True),
    Tensor("exclude_input_in_output", mc.TYPE_BOOL, optional=True),
    Tensor("draft_len", mc.TYPE_INT32, optional=True),  # drafts per round, 0 = speculation off (AR baseline)
    Tensor("mode", mc.TYPE_STRING, optional=True),  # "ar" | "dflash" | "ddtree"; default: the deployment's
    # text_output without special tokens (eos); default false
    Tensor("skip_special_tokens", mc.TYPE_BOOL, optional=True),
    # tensorrtllm_backend's flag: true adds acceptance_rate and acceptance_histogram to the responses
    Tensor("return_perf_metrics", mc.TYPE_BOOL, optional=True),
    # true: cancel the running request that has this request's id (how the dialect models cancel
    # what they forwarded where Triton's BLS cannot; upstream's tensorrt_llm model takes `stop` so)
    Tensor("stop", mc.TYPE_BOOL, optional=True),
    # Token-level stop and bad words, tensorrtllm_backend's: text words tokenized as its
    # preprocessing tokenizes them, or token ids in its [2, N] word-list layout (ids; cumulative ends,
    # -1 padded). A stop sequence ends the request and stays in the output; a bad word never appears.
    Tensor("stop_sequences", mc.TYPE_STRING, (-1,), optional=True),
    Tensor("stop_words_list", mc.TYPE_INT32, (2, -1), optional=True),
    Tensor("bad_words", mc.TYPE_STRING, (-1,), optional=True),
    Tensor("bad_words_list", mc.TYPE_INT32, (2, -1), optional=True),
    Tensor("return_log_probs", mc.TYPE_BOOL, optional=True),  # adds output_log_probs / cum_log_probs
    # true: the end token (end_id, else eos) that ends the request is left out of the output, as
    # TensorRT-LLM's executor leaves it out (NVIDIA/TensorRT-LLM#2190); default false: it is kept
    Tensor("skip_end_token", mc.TYPE_BOOL, optional=True),
)
# Responses of the dflash model: one value per Update field its renderer (serve/triton_outputs.py)
# sends; the dialect models forward the [1] ones as they are (serve/dialect.py).
DFLASH_OUTPUTS = (
    Tensor("text_output", mc.TYPE_STRING, doc="the text generated in this response"),
    Tensor("output_token_count", mc.TYPE_INT32, doc="tokens committed in this response"),
    Tensor("total_output_tokens", mc.TYPE_INT32, doc="tokens generated so far"),
    Tensor("rounds", mc.TYPE_INT32, doc="target verify passes so far"),
    Tensor("total_draft_tokens", mc.TYPE_INT32, doc="draft tokens verified so far"),
    Tensor("total_accepted_draft_tokens", mc.TYPE_INT32, doc="draft tokens accepted so far"),
    Tensor("acceptance_length", mc.TYPE_FP32, doc="tokens committed per verify pass so far (tau)"),
    Tensor("finish_reason", mc.TYPE_STRING, doc="`length` / `stop` on the last response, empty before"),
    Tensor("avg_decoded_tokens_per_iter", mc.TYPE_FP32, doc="output tokens per iteration so far, the prefill "
                                                             "counting as one (trtllm-serve's)"),
    # the tokens committed in this response; only when asked for
    Tensor("output_ids", mc.TYPE_INT32, (-1,), doc="the tokens committed in this response"),
    # With return_perf_metrics (or when named). acceptance_rate: accepted / drafted so far, FP32 [1]
    # as tensorrtllm_backend's tensorrt_llm model declares it; acceptance_histogram (ours, the shape of
    # TensorRT-LLM PR #19311's): [block_size] verify passes so far by the drafts each accepted.
    Tensor("acceptance_rate", mc.TYPE_FP32, doc="accepted / drafted draft tokens so far"),
    Tensor("acceptance_histogram", mc.TYPE_INT32, (-1,), doc="verify passes so far by the drafts each accepted"),
    # return_log_probs: each of this response's tokens' log-probability under the target, and their
    # sum over the whole output so far; only when asked for
    Tensor("output_log_probs", mc.TYPE_FP32, (-1,), doc="each token's log-probability under the target"),
    Tensor("cum_log_probs", mc.TYPE_FP32, doc="the log-probabilities' sum over the whole output so far"),
)


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
            raise UserError(f"kv_cache_free_gpu_mem_fraction: {self.kv_cache_free_gpu_mem_fraction}, expected 0 < f <= "
                            "1")
        if self.torch_threads < 0:
            raise UserError(f"torch_threads: {self.torch_threads}, expected >= 0 (0: the deployment's default)")
        self.device_ids  # noqa: B018  (refused here, at read time)

    @property
    def device_ids(self) -> list[int] | None:
        """gpu_device_ids as integers; None: the GPUs in order."""
        if not self.gpu_device_ids:
            return None
        try:
            return [int(x) for x in self.gpu_device_ids.split(",")]
        except ValueError:
            raise UserError(f"gpu_device_ids: {self.gpu_device_ids!r}: expected comma-separated GPU ids, "
                            "e.g. 0,1") from None

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
                raise UserError(f"{where}: parameter {key}: {text!r} is not "
                                f"a{'n integer' if kind == 'int' else ' number'}") from None
        try:
            return cls(**values)
        except UserError as e:  # a value out of its range: name the file as well
            raise UserError(f"{where}: parameter {e}") from None


def model_settings(model_dir: Path) -> ModelSettings:
    """The settings a dflash model's config.pbtxt gives (as written: paths not resolved); one
    line naming the file and the parameter when it cannot be read or a parameter is wrong."""
    from google.protobuf import text_format

    path = Path(model_dir) / "config.pbtxt"
    try:
        cfg = text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError) as e:
        raise UserError(f"{path}: cannot read the deployed model: {e}") from None
    return ModelSettings.from_params({k: v.string_value for k, v in cfg.parameters.items()}, str(path))


def repository_model(deploy_dir: Path, model_name: str) -> tuple[Path, ModelSettings]:
    """(version directory, settings with absolute paths) of the dflash model in a deploy output."""
    model_dir = Path(deploy_dir) / REPOSITORY / model_name
    settings = model_settings(model_dir)
    if settings.checkpoint is None:
        raise UserError(f"{model_dir / 'config.pbtxt'}: no checkpoint parameter: not a reference-backend deployment")
    return model_dir / "1", settings.resolved(deploy_dir)
