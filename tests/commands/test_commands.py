"""The CLI contract: subcommands, exit codes, one-line errors, JSON output."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "trtllm_dflash", *args], capture_output=True, text=True, cwd=cwd)


def in_process(capsys, *args) -> subprocess.CompletedProcess:
    """cli.main in this process (`python -m trtllm_dflash` exits with its value; the invalid-recipe
    test here checks the process itself): what it returns and prints."""
    from trtllm_dflash.cli import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), rc, out, err)


def test_help_lists_subcommands(capsys):
    from trtllm_dflash.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for name in ("recipes", "check", "plan"):
        assert name in out


def test_check_all_recipes_ok(capsys):
    for path in sorted(RECIPES.glob("*/*.yaml")):
        r = in_process(capsys, "check", str(path))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("ok: ")


def test_invalid_recipe_exits_2_with_one_line(tmp_path):
    raw = yaml.safe_load((RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml").read_text())
    raw["quantization"]["target_weights"] = "nvfp4"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    r = cli("check", str(bad))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    # its YAML line and column
    assert re.match(rf"error: {re.escape(str(bad))}:\d+:\d+: quantization.target_weights:", r.stderr)


def test_plan_json_for_the_headline_deployment(capsys):
    r = in_process(capsys, "plan", str(RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["device"] == "b300" and p["tp"] == 8 and p["fits"] is True
    assert p["max_concurrency"] >= 256
    assert {row["component"] for row in p["rows"]} >= {"target weights", "target KV cache", "drafter context cache"}


def test_plan_table_names_per_device_memory(capsys):
    r = in_process(capsys, "plan", str(RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"))
    assert r.returncode == 0, r.stderr
    assert "max concurrency that fits" in r.stdout and "target KV cache" in r.stdout


def test_recipes_lists_everything_as_json(capsys):
    r = in_process(capsys, "recipes", "--json")
    assert r.returncode == 0, r.stderr
    names = {row["name"] for row in json.loads(r.stdout)}
    assert "b300x8-gpt-oss-120b-nvfp4" in names and "cpu-tiny-pystd" in names


def test_output_that_is_not_a_terminal_gets_the_tables_100_columns(monkeypatch):
    """A log or a pipe gets the 100 columns the sweep and projection tables are laid out for
    (rich's own default there is 80, which cuts numbers to '…'); COLUMNS still wins."""
    import io

    from trtllm_dflash.commands.common import LOG_COLUMNS, make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    assert LOG_COLUMNS == 100 and make_console(file=io.StringIO()).width == 100
    monkeypatch.setenv("COLUMNS", "120")
    assert make_console(file=io.StringIO()).width == 120


def test_every_command_has_a_description_in_its_help():
    import argparse

    from trtllm_dflash.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [name for name, p in sub.choices.items() if not (p.description or "").strip()]
    assert not missing, f"`--help` without a description: {missing}"


def test_recipes_prints_every_path_in_full(capsys):
    from trtllm_dflash.cli import main

    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    for path in sorted(RECIPES.glob("*/*.yaml")):
        assert f": {path}" in out or any(line.endswith(str(path.relative_to(RECIPES))) for line in out.splitlines())


def test_a_yaml_syntax_error_names_its_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhardware: {gpu: h100-sxm\n  count: 1\n")
    r = in_process(capsys, "check", str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: {bad}: not valid YAML: line 3, column 8: expected ',' or '}}'")
