"""The README's recipe reference and commands stay in sync with the code."""

import re
from pathlib import Path

from trtllm_dflash.recipe import recipe_reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_readme_recipe_reference_is_generated_from_the_schema():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- recipe-reference:start -->\n(.*)\n<!-- recipe-reference:end -->", readme, re.S)
    assert block, "README lost its recipe-reference markers"
    assert block.group(1) == recipe_reference_markdown(), (
        "README recipe reference is stale: regenerate it from trtllm_dflash.recipe.recipe_reference_markdown()"
    )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_command = commands[1].strip()
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_command_and_bench_mode_has_a_row_in_the_readme_command_table():
    import argparse

    from trtllm_dflash.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Commands"):readme.index("The Python API of the reference backend")]
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z-]+(?: [a-z]+)?)", table, re.M)}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    bench = next(a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    expected = {c for c in sub.choices if c != "bench"} | {f"bench {m}" for m in bench.choices}
    assert not expected - {r.split(" [")[0] for r in rows}, f"commands without a README row: {sorted(expected - rows)}"
