"""Plumbing shared by the training loops (target.py, drafter.py, ar_draft.py).

Only the pieces that are the same logic in every caller live here: the AdamW parameter
groups, checkpoint save/load/restore, the resume-compatibility check, one optimizer step, the
progress bar and the atomic swap of an exported directory. What each loop trains, its
data order, schedule and checkpoint contents stay in its own module.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from trtllm_dflash.artifacts import replace_dir
from trtllm_dflash.errors import UserError


def adamw_decay_groups(model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]):
    """AdamW where matrices (dim >= 2) are decayed and vectors (norms, biases) are not.

    The groups are [decayed, not decayed], each in `named_parameters()` order: optimizer
    state dicts in existing checkpoints index parameters in this order."""
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
    )


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (loops that compute lr themselves)."""
    for g in opt.param_groups:
        g["lr"] = lr


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float) -> None:
    """Clear the gradients, backpropagate `loss`, clip the global gradient norm, step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()


def atomic_torch_save(obj, path: Path) -> None:
    """torch.save to PATH.tmp, then rename over `path`: a crash never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(path: Path, resumable: dict, **values) -> None:
    """Atomically write to `path` (creating its directory) the state of every object of
    `resumable` under its name (a torch.Generator's get_state(), else state_dict()), then
    `values`: the dict `restore` reads back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    states = {k: o.get_state() if isinstance(o, torch.Generator) else o.state_dict() for k, o in resumable.items()}
    atomic_torch_save({**states, **values}, path)


def restore(saved: dict, resumable: dict) -> None:
    """Load every object of `resumable` from its entry of a checkpoint save_checkpoint wrote."""
    for k, o in resumable.items():
        o.set_state(saved[k]) if isinstance(o, torch.Generator) else o.load_state_dict(saved[k])


def load_checkpoint(path: Path) -> dict:
    """The dict saved at `path` (on CPU); a missing file is the user's --resume mistake."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--resume: no checkpoint at {path}")
    return torch.load(path, map_location="cpu", weights_only=False)


def check_resume(
    saved: dict,
    want: dict,
    path: Path,
    what: str,
    free: Iterable[str] = (),
    rerun_with: str = "the same settings",
) -> None:
    """Refuse to resume when a field of `want` (not in `free`) differs from the checkpoint's.

    `saved` is the dict stored in the checkpoint at `path`; `what` names the kind of field
    in the message ("train config field", "training setting", ...)."""
    free = set(free)
    for k, v in want.items():
        if k not in free and saved.get(k) != v:
            raise UserError(
                f"{path}: cannot resume, {what} {k!r} is {saved.get(k)!r} in the checkpoint but {v!r} now; "
                f"rerun with {rerun_with} or without --resume"
            )


def progress_bar(label: str, fields: str, show: bool):
    """A rich bar on stderr: label, bar, done/total, `fields` (a TextColumn format over
    task.fields), elapsed and remaining time. Disabled unless `show` and stderr is a
    terminal; its console (`bar.console`) still prints log lines."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(fields),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not (show and console.is_terminal),
    )


@contextmanager
def atomic_dir(out_dir: Path) -> Iterator[Path]:
    """Yield OUT.tmp (not yet created) for the writer to create and fill; on success it
    replaces OUT whole (artifacts.replace_dir), so OUT is always either the old or the new
    directory. A stale OUT.tmp from an earlier crash is removed first. On an exception
    nothing is swapped (OUT.tmp is left for inspection). Unlike a pipeline stage (artifacts.atomic_stage_dir) a training
    export has no manifest and replaces an earlier export of any run."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    yield tmp
    replace_dir(tmp, out_dir)
