"""The models root: the one directory a deployment's Hugging Face ids are downloaded into, one
`ORG/NAME` folder per id, as `hf download ORG/NAME --local-dir ROOT/ORG/NAME` writes them
(huggingface_hub's `hf` command, 0.34 on; its older CLI is gone from 1.0). Named by
`--models DIR` on any command or by $TRTLLM_DFLASH_MODELS; either way a directory that does not
exist is the same one line. Without a root the local Hugging Face cache is searched.

A folder may hold a stand-in (recipe/stand_ins.py) instead of the download: its config.json
carries STAND_IN_KEY, naming the id it stands in for.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from trtllm_dflash.errors import UserError

MODELS_ROOT_ENV = "TRTLLM_DFLASH_MODELS"
STAND_IN_KEY = "trtllm_dflash_stand_in"


def checked_root(value: str, named_by: str) -> Path:
    """`value` as a models root, resolved; one line naming how it was given when it is not a
    directory (`--models DIR` and $TRTLLM_DFLASH_MODELS get the same line)."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"{named_by} {value}: no such directory (the models root: create it, then "
                        f"`hf download ORG/NAME --local-dir {value}/ORG/NAME` for each Hugging Face id)")
    return path.resolve()


def models_root() -> Path | None:
    """The models root $TRTLLM_DFLASH_MODELS names (`--models` sets it), None when unset."""
    value = os.environ.get(MODELS_ROOT_ENV)
    return checked_root(value, f"${MODELS_ROOT_ENV}") if value else None


def download_hint(repo_id: str, field: str) -> str:
    """What to run when `repo_id` is found nowhere: the `hf download` line into the models root."""
    root = models_root()
    if root is None:
        return (f"`hf download {repo_id} --local-dir MODELS/{repo_id}`, then pass --models MODELS "
                f"(or set ${MODELS_ROOT_ENV}) to every stage, or set {field}.source to the directory")
    return f"`hf download {repo_id} --local-dir {root}/{repo_id}`, or set {field}.source to the directory"


def hub_download(repo_id: str) -> Path | None:
    """Where an HF id's checkpoint is on this machine: ROOT/ORG/NAME (or ROOT/NAME) under the
    models root, else the snapshot in the local Hugging Face cache (huggingface_hub, no network);
    None if neither holds a config.json."""
    root = models_root()
    return _hub_download(repo_id, str(root) if root else None, os.environ.get("HF_HUB_CACHE"))


@functools.lru_cache(maxsize=64)
def _hub_download(repo_id: str, root: str | None, hub_cache: str | None) -> Path | None:
    if root:
        for d in (Path(root) / repo_id, Path(root) / repo_id.split("/")[-1]):
            if (d / "config.json").is_file():
                return d.resolve()
    try:
        from huggingface_hub import snapshot_download

        cached = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=hub_cache))
    except Exception:  # not in the cache (or not a valid id): the caller says what to download
        return None
    return cached if (cached / "config.json").is_file() else None


def stand_in_of(directory: Path) -> str | None:
    """The HF id a stand-in checkpoint stands in for; None for any other directory."""
    try:
        cfg = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    mark = cfg.get(STAND_IN_KEY) if isinstance(cfg, dict) else None
    return mark.get("of") if isinstance(mark, dict) else None
