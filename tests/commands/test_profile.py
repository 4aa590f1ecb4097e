"""`profile`: acceptance on the user's own prompts, per category, from the deployed checkpoint;
`project --acceptance` reads its JSON. The embedded default's deploy output is shared with the
OpenAI server's tests (conftest.embedded_run)."""

import json

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.prompts.user import load_user_prompts

pytest.importorskip("matplotlib", reason="needs matplotlib (the serve extra) for profile.png")

CODE = ["def add(a, b):\n    return", "import os\n\ndef main():\n    ", "class Point:\n    def __init__(self, x, y):\n"]
CHAT = [[{"role": "user", "content": "write a function that reverses a list"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]]


def _prompts(tmp_path):
    lines = [json.dumps({"prompt": p, "category": "code"}) for p in CODE]
    lines += [json.dumps({"messages": m, "category": "chat"}) for m in CHAT]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
    return path


@pytest.fixture(scope="module")
def profiled(embedded_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    out = tmp / "out"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["profile", "--from", str(embedded_run / "deploy"), "--prompts", str(_prompts(tmp)),
                     "--max-new-tokens", "24", "--out", str(out), "--json"]) == 0
    return tmp, out, json.loads(buf.getvalue().splitlines()[-1])


def test_profile_writes_per_category_json_and_png(profiled):
    _, out, rep = profiled
    assert json.loads((out / "profile.json").read_text()) == rep
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(rep["categories"]) == ["code", "chat"]
    assert rep["categories"]["code"]["prompts"] == 3 and rep["overall"]["prompts"] == 5
    for e in (*rep["categories"].values(), rep["overall"]):
        assert len(e["conditional_acceptance"]) == rep["max_draft_len"] == rep["block_size"] - 1
        assert e["tau_decoded"] >= 1 and e["accepted_per_round"] == pytest.approx(e["tau_decoded"] - 1)
        assert all(a is None or 0 <= a <= 1 for a in e["acceptance_by_position"])
        assert e["dflash_tok_s"] > 0 and e["ar_tok_s"] > 0
    # The overall pools the categories' verify passes: its tau lies between theirs.
    taus = [e["tau_decoded"] for e in rep["categories"].values()]
    assert min(taus) - 1e-9 <= rep["overall"]["tau_decoded"] <= max(taus) + 1e-9
    assert rep["overall"]["rounds"] == sum(e["rounds"] for e in rep["categories"].values())
    assert rep["overall"]["tau_decoded"] > 1.2  # the shipped pair accepts drafts on code


@pytest.mark.parametrize("text,where,message", [
    ('{"prompt": "a"}\n{"prompt": \n', ":2:", "not valid JSON"),
    ('{"prompt": "a"}\n\n{"text": "b"}\n', ":3:", "no 'prompt' or 'messages' field"),
    ('{"messages": [{"role": "bot", "content": "x"}]}\n', ":1:", "messages.0 must be"),
    ('{"prompt": "a", "category": 3}\n', ":1:", "category must be a non-empty string"),
    ('\n\n', "", "no prompts"),
    ('[{"conversations": [{"from": "gpt", "value": "hi"}]}]', ": entry 0:", "no human turn"),
])
def test_a_malformed_prompts_file_is_refused_in_one_line(tmp_path, capsys, embedded_run, text, where, message):
    path = tmp_path / ("p.json" if text.startswith("[") else "p.jsonl")
    path.write_text(text)
    assert main(["profile", "--from", str(embedded_run / "deploy"), "--prompts", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}{where}" in err and message in err and "Traceback" not in err


def test_sharegpt_prompts_end_at_the_first_human_turn(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"category": "qa", "conversations": [
        {"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
        {"from": "human", "value": "q2"}]}]))
    (p,) = load_user_prompts(path)
    assert p.category == "qa" and p.text is None
    assert p.messages == ({"role": "system", "content": "s"}, {"role": "user", "content": "q"})


def test_project_uses_the_profile_overall_or_one_category(profiled, capsys):
    tmp, out, rep = profiled
    for extra, entry in (([], rep["overall"]), (["--category", "chat"], rep["categories"]["chat"])):
        assert main(["project", "--acceptance", str(out / "profile.json"), *extra, "--out", str(tmp / "proj"),
                     "--json"]) == 0
        proj = json.loads(capsys.readouterr().out)
        assert proj["acceptance"]["conditional_acceptance"] == entry["conditional_acceptance"]
        assert entry["task"] in proj["acceptance"]["source"] or proj["acceptance"]["task"] == entry["task"]
    assert main(["project", "--acceptance", str(out / "profile.json"), "--category", "nope",
                 "--out", str(tmp / "proj")]) == 2
    assert "--category nope" in capsys.readouterr().err
