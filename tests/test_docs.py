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
