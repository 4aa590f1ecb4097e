"""The guides (docs/guides/*.md) cannot rot: every command in them is checked.

A guide marks each fenced block with an HTML comment on the line before it:
  <!-- guide: cpu -->        run here, on CPU, with stand-in checkpoints (tests/helpers/guide_models.py)
  <!-- guide: cpu-fails -->  each line run here must fail (troubleshooting: the error shown after it)
  <!-- guide: gpu -->        needs the GPU box: its `trtllm-dflash` lines are parsed, not run
  <!-- guide: download -->   `huggingface-cli download ID --local-dir $TRTLLM_DFLASH_MODELS/ID` lines:
                             the test makes the stand-in for each ID instead
  <!-- guide: output -->     what the block before it prints: every line must be among that block's
                             output lines (`$PWD` for the working directory; a line ending in `...`
                             matches as a prefix)
The default suite parses every `trtllm-dflash` line against the CLI's argparse and checks every
recipe path and image; the slow test runs the CPU blocks of each guide in one shell."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
GUIDES = [g for g in GUIDES if g.name != "README.md"]
BLOCK = re.compile(r"<!-- guide: ([a-z-]+) -->\n```(?:bash|console)\n(.*?)\n```", re.S)


def blocks(guide: Path) -> list[tuple[str, str]]:
    """(kind, text) of every marked block, in order; a fenced bash / console block must be marked."""
    text = guide.read_text()
    marked = BLOCK.findall(text)
    fenced = re.findall(r"```(?:bash|console)\n", text)
    assert len(marked) == len(fenced), f"{guide.name}: a ```bash / ```console block without a <!-- guide: KIND --> mark"
    return marked


def command_lines(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped, `A; B` split."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        out += [part.strip() for part in line.split("; ") if part.strip()]
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return sub.choices if sub else {}


def check_cli_line(line: str, env: dict[str, str], parse: bool = True) -> None:
    """A `trtllm-dflash ...` line: its subcommand exists and (`parse`) its flags parse; the recipe it
    names exists. Troubleshooting lines (cpu-fails) may be refused by argparse on purpose."""
    from trtllm_dflash.cli import build_parser

    for name, value in env.items():
        line = line.replace(f"${name}", value)
    args = shlex.split(line)[1:]
    parser = build_parser()
    sub = _subparsers(parser)
    assert args and args[0] in sub, f"unknown command in {line!r}"
    if not parse:
        return
    try:
        ns = parser.parse_args(args)
    except SystemExit as e:
        raise AssertionError(f"argparse refuses {line!r}") from e
    recipe = getattr(ns, "recipe", None)
    if recipe:
        assert (ROOT / recipe).is_file(), f"{line!r} names {recipe}, which is not in this repository"


def _guide_env(guide: Path) -> dict[str, str]:
    """The shell variables the guide sets (`R=...`, `D=...`, `T="..."`), as written."""
    env = {}
    for kind, text in blocks(guide):
        if kind in ("cpu", "gpu", "cpu-fails"):
            for cmd in command_lines(text):
                m = re.fullmatch(r"([A-Z][A-Z0-9]*)=(\"[^\"]*\"|\S+)", cmd)
                if m:
                    env[m.group(1)] = m.group(2).strip('"')
    return dict(sorted(env.items(), key=lambda kv: -len(kv[0])))


def test_the_guides_exist_for_every_path():
    names = {g.name for g in GUIDES}
    assert {"dgx-h100-engine.md", "h200-trtllm-1.3.md", "b300x8-gpt-oss-120b.md", "multi-node.md"} <= names


@pytest.mark.parametrize("guide", GUIDES, ids=lambda g: g.stem)
def test_every_guide_command_parses_and_names_what_exists(guide):
    from trtllm_dflash.recipe.containers import NVIDIA_REGISTRY, TRITON_TRTLLM_1_2, TRTLLM_RELEASE

    env = _guide_env(guide)
    seen = 0
    for kind, text in blocks(guide):
        if kind == "output":
            continue
        for cmd in command_lines(text):
            if cmd.startswith("trtllm-dflash "):
                check_cli_line(cmd, env, parse=kind != "cpu-fails")
                seen += 1
            if kind == "download":
                assert re.fullmatch(r"huggingface-cli download (\S+) --local-dir \$TRTLLM_DFLASH_MODELS/\1", cmd), cmd
        for ref in re.findall(r"recipes/\S+?\.yaml", text):
            assert (ROOT / ref).is_file(), f"{guide.name} names {ref}"
        for image in re.findall(r"nvcr\.io[/#](\S+)", text):
            assert image == TRITON_TRTLLM_1_2 or image.startswith(TRTLLM_RELEASE + ":"), (
                f"{guide.name}: {NVIDIA_REGISTRY}/{image} is not an image trtllm_dflash/recipe/containers.py names")
    assert seen, f"{guide.name} has no trtllm-dflash command"


def test_the_parse_check_fails_on_a_broken_command():
    with pytest.raises(AssertionError):
        check_cli_line("trtllm-dflash convert recipes/hopper/h100-qwen3-8b-fp8.yaml --outt x", {})
    with pytest.raises(AssertionError):
        check_cli_line("trtllm-dflash convert recipes/hopper/nope.yaml --out x", {})
    with pytest.raises(AssertionError):
        check_cli_line("trtllm-dflash convrt recipes/hopper/h100-qwen3-8b-fp8.yaml", {})


# ---- the slow run: each guide's CPU blocks in one shell, on stand-in checkpoints ----

WRAPPER = """
set -uo pipefail
# Stage commands on the stand-ins: their facts come from their config.json (guide_models.STANDIN_SETS).
# check / plan / project answer from the recipe's catalog facts, as they do over the real downloads
# (which agree with the catalog), so they do not see the stand-ins.
trtllm-dflash() {{
  case "$1" in
    recipes|check|plan|project) env -u TRTLLM_DFLASH_MODELS trtllm-dflash "$@" ;;
    *) if [ -n "${{TRTLLM_DFLASH_MODELS:-}}" ]; then command trtllm-dflash "$@" {sets}; else command trtllm-dflash "$@"; fi ;;
  esac
}}
"""


def guide_script(guide: Path, sets: list[str]) -> str:
    """One bash script: every cpu / cpu-fails block, each between markers, stderr with stdout."""
    lines = [WRAPPER.format(sets=" ".join(f"--set {s}" for s in sets))]
    for i, (kind, text) in enumerate(blocks(guide)):
        if kind not in ("cpu", "cpu-fails"):
            continue
        lines.append(f"echo '@@block {i}@@'")
        for cmd in command_lines(text):
            if kind == "cpu":
                lines.append(f"{cmd} 2>&1 || {{ echo '@@failed@@ {cmd}'; exit 1; }}")
            else:
                lines.append(f"if {cmd} 2>&1; then echo '@@succeeded@@ {cmd}'; exit 1; fi")
    return "\n".join(lines) + "\n"


def _outputs(stdout: str) -> dict[int, list[str]]:
    parts = re.split(r"^@@block (\d+)@@$", stdout, flags=re.M)
    return {int(parts[i]): [l.strip() for l in parts[i + 1].splitlines()] for i in range(1, len(parts), 2)}


def _ids(guide: Path) -> list[str]:
    return [cmd.split()[2] for kind, text in blocks(guide) if kind == "download" for cmd in command_lines(text)]


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=lambda g: g.stem)
def test_a_guide_runs_on_cpu_up_to_the_gpu(guide, tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from guide_models import STANDIN_SETS, make_models_root

    make_models_root(tmp_path / "models", _ids(guide))
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    env = {k: v for k, v in os.environ.items() if k != "TRTLLM_DFLASH_MODELS"}
    env.update(HOME=str(tmp_path), HF_HUB_CACHE=str(tmp_path / "no-hub-cache"), COLUMNS="200", HF_HUB_OFFLINE="1")
    r = subprocess.run(["bash", "-c", guide_script(guide, STANDIN_SETS)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0 and "@@failed@@" not in r.stdout and "@@succeeded@@" not in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    printed = _outputs(r.stdout.replace(str(tmp_path), "$PWD"))
    marked = blocks(guide)
    for i, (kind, text) in enumerate(marked):
        if kind != "output":
            continue
        assert i - 1 in printed, f"{guide.name}: an output block after a block that is not run here"
        for want in filter(None, (l.strip() for l in text.splitlines())):
            ok = any(got.startswith(want[:-3]) for got in printed[i - 1]) if want.endswith("...") else want in printed[i - 1]
            assert ok, f"{guide.name}: {want!r} is not what the command printed:\n" + "\n".join(printed[i - 1][-30:])
