"""`serve --runners R`: serve a deployed repository with other runners than deploy chose.

The deploy output is never edited: the repository is copied (config.pbtxt, model.py and
recipe.yaml are small; the checkpoint and engines stay where the parameters point, by absolute
path in the copy) into a work directory with the dflash model's `runners` parameter replaced. Triton then loads the
very same model file (serve/triton_model.py) with, e.g., the reference runners over the
checkpoint an engine deployment was built from.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_dflash.deploy.settings import PATHS
from trtllm_dflash.errors import UserError
from trtllm_dflash.runtime import RUNNERS


def _model_config(repository: Path, model_name: str):
    """(path, parsed ModelConfig) of `model_name`'s config.pbtxt in `repository`."""
    config = Path(repository) / model_name / "config.pbtxt"
    if not config.is_file():
        raise UserError(f"{repository}: no model {model_name!r} (config.pbtxt missing)")
    return config, text_format.Parse(config.read_text(), mc.ModelConfig())


def with_runners(repository: Path, model_name: str, runners: str, workdir: Path) -> Path:
    """A copy of `repository` in `workdir` whose model `model_name` runs `runners`; returns its path."""
    if runners not in RUNNERS:
        raise UserError(f"--runners {runners}: allowed: {', '.join(RUNNERS)}")
    config, cfg = _model_config(repository, model_name)
    if "runners" not in cfg.parameters:
        raise UserError(f"{config}: the {model_name!r} model has no runners parameter (a pytorch-backend "
                        "repository runs TensorRT-LLM's own model: --runners does not apply)")
    if runners != "tensorrt" and "checkpoint" not in cfg.parameters:
        raise UserError(f"{config}: --runners {runners} serves the checkpoint the engines were built from, and this "
                        "deployment records none (deploy from a build output made with --from)")
    return with_parameters(repository, model_name, {"runners": runners}, workdir, f"`serve --runners {runners}`")


def with_parameters(repository: Path, model_name: str, params: dict[str, str], workdir: Path, why: str) -> Path:
    """A copy of `repository` in `workdir` whose model `model_name` has `params` set (config.pbtxt
    parameters, e.g. torch_threads); returns its path. `why` goes into a comment of the copy."""
    config, cfg = _model_config(repository, model_name)
    out = Path(workdir) / "model_repository"
    shutil.copytree(repository, out)
    for key in PATHS:  # relative to the deploy output, which the copy is not in
        if key in cfg.parameters and key not in params:
            relative = cfg.parameters[key].string_value
            cfg.parameters[key].string_value = str((Path(repository).parent / relative).resolve())
    for key, value in params.items():
        cfg.parameters[key].string_value = value
    header = "".join(line + "\n" for line in config.read_text().splitlines() if line.startswith("#"))
    (out / model_name / "config.pbtxt").write_text(
        header + f"# {', '.join(params)} replaced by {why}\n" + text_format.MessageToString(cfg))
    return out
