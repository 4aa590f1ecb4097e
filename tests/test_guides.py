"""The guides (docs/guides/*.md) cannot rot: every command in them is checked.

A guide marks each fenced block with an HTML comment on the line before it:
  <!-- guide: cpu -->        run here, on CPU, as written (the guide's own `models --stand-ins` block
                             lays out the stand-in checkpoints the later blocks run on)
  <!-- guide: cpu-fails -->  each line run here must fail (troubleshooting: the error shown after it)
  <!-- guide: gpu -->        needs the GPU box: its `trtllm-dflash` lines are parsed, not run
  <!-- guide: download -->   `hf download ID --local-dir $TRTLLM_DFLASH_MODELS/ID` lines: not run here
                             (the stand-ins take their place), their flags checked against the
                             installed huggingface_hub's `hf download`
  <!-- guide: output -->     what the block before it prints: every line must be among that block's
                             output lines (`$PWD` for the working directory; a line ending in `...`
                             matches as a prefix)
The default suite parses every `trtllm-dflash` line against the CLI's argparse and checks every
recipe path and image, that the install lines name the same extras and that every shipped recipe
is reachable from the README's path table or a guide; the slow test runs the CPU blocks of each
guide in one shell, with nothing added: no flags, no wrapper function, no environment beyond a
fresh HOME and an empty Hugging Face cache (a new user's machine)."""

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

    for name, value in env.items():  # whole names: $T is not the start of $TRTLLM_DFLASH_MODELS
        line = re.sub(rf"\${name}\b", lambda _: value, line)
    line = re.sub(r"(\s+(\d?>>?\s*\S+|\d?>&\d)|\s*&)+$", "", line)  # a server started in the background: `> LOG 2>&1 &`
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
                assert re.fullmatch(r"hf download (\S+) --local-dir \$TRTLLM_DFLASH_MODELS/\1", cmd), cmd
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


# ---- what a newcomer installs, and where each recipe is found ----

INSTALL = re.compile(r"pip install -e '\.\[([a-z,]+)\]'")


def _extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_readme_and_the_guides_install_the_same_extras():
    """The README's quick start and the guides' convention are one install line, of extras
    pyproject.toml has, `quant` among them: the guides' CPU blocks quantize (ModelOpt)."""
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set up"):readme.index("## Your checkpoints")]
    lines = {"README.md": INSTALL.findall(setup)[0],
             "docs/guides/README.md": INSTALL.findall((ROOT / "docs/guides/README.md").read_text())[0]}
    assert len(set(lines.values())) == 1, lines
    named = lines["README.md"].split(",")
    assert set(named) <= set(_extras()) and "quant" in named, named
    assert any(d.startswith("nvidia-modelopt") for d in _extras()["quant"])
    runs_quantize = [g.name for g in GUIDES for kind, text in blocks(g) if kind == "cpu"
                     for cmd in command_lines(text)
                     if cmd.split()[:2] in (["trtllm-dflash", "quantize"], ["trtllm-dflash", "run"])]
    assert runs_quantize


def test_every_shipped_recipe_is_reachable_from_the_path_table_or_a_guide():
    from trtllm_dflash.recipe import list_recipes, recipes_root

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Pick your path"):readme.index("## Status")]
    text = table + "".join(g.read_text() for g in GUIDES)
    unreached = [f"recipes/{p.relative_to(recipes_root())}" for p in list_recipes()
                 if f"recipes/{p.relative_to(recipes_root())}" not in text]
    assert not unreached, f"shipped recipes in no row of the README's path table and no guide: {unreached}"


# ---- the slow run: each guide's CPU blocks in one shell, as written ----


def guide_script(guide: Path) -> str:
    """One bash script: every cpu / cpu-fails block, each between markers, stderr with stdout."""
    lines = ["set -uo pipefail"]
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
    return {int(parts[i]): [line.strip() for line in parts[i + 1].splitlines()] for i in range(1, len(parts), 2)}


def _hf_download_flags() -> str:
    """`hf download --help` of the installed huggingface_hub (its CLI entry point, run as `hf`)."""
    r = subprocess.run([sys.executable, "-c", "import sys; from huggingface_hub.cli.hf import main; "
                        "sys.argv[0] = 'hf'; main()", "download", "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
def test_the_download_lines_are_what_the_installed_hf_download_takes():
    help_text = _hf_download_flags()
    assert "REPO_ID" in help_text and "--local-dir" in help_text
    for guide in GUIDES:
        for kind, text in blocks(guide):
            for cmd in command_lines(text) if kind == "download" else []:
                flags = [a for a in shlex.split(cmd)[2:] if a.startswith("--")]
                assert flags == ["--local-dir"] and all(f in help_text for f in flags), (guide.name, cmd)


# Guides whose CPU blocks start servers that bind every interface (NVIDIA Dynamo 1.6.1's event
# plane): they run in a loopback-only network namespace (tests/helpers/dynamo_helpers.py).
LOOPBACK_ONLY = {"dynamo.md"}


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=lambda g: g.stem)
def test_a_guide_runs_on_cpu_up_to_the_gpu(guide, tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from dynamo_helpers import skip_reason

    cmd = ["bash", "-c", guide_script(guide)]
    if guide.name in LOOPBACK_ONLY:
        if skip_reason():
            pytest.skip(skip_reason())
        cmd = ["unshare", "-n", "bash", "-c", "ip link set lo up\n" + cmd[2]]
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    env = {k: v for k, v in os.environ.items() if k != "TRTLLM_DFLASH_MODELS"}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path), HF_HUB_CACHE=str(tmp_path / "hub-cache"))
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0 and "@@failed@@" not in r.stdout and "@@succeeded@@" not in r.stdout, tail
    printed = _outputs(r.stdout.replace(str(tmp_path), "$PWD"))
    marked = blocks(guide)
    for i, (kind, text) in enumerate(marked):
        if kind != "output":
            continue
        assert i - 1 in printed, f"{guide.name}: an output block after a block that is not run here"
        for want in filter(None, (line.strip() for line in text.splitlines())):
            got = printed[i - 1]
            ok = any(line.startswith(want[:-3]) for line in got) if want.endswith("...") else want in got
            assert ok, f"{guide.name}: {want!r} is not what the command printed:\n" + "\n".join(printed[i - 1][-30:])
