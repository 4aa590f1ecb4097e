"""A Laguna drafter from its config.json to served text: convert, deploy and a real tritonserver
(the reference backend, the support table's one row for it), against the in-memory decode."""

import asyncio

import numpy as np
import pytest

from serve_helpers import loaded_pair, served_pair

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
grpcclient = pytest.importorskip("tritonclient.grpc.aio")

from trtllm_dflash.reference import generate  # noqa: E402
from trtllm_dflash.reference.config import LAGUNA_ARCH, read_json  # noqa: E402

PROMPT = "def area(r):\n    return"


async def complete(url: str, prompt: str, max_tokens: int) -> tuple[str, dict]:
    """One streamed request: (the text, the last response's outputs)."""
    inputs = []
    for name, value, dtype in (("text_input", prompt, "BYTES"), ("max_tokens", np.int32(max_tokens), "INT32"),
                               ("stream", True, "BOOL")):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else None))
        inputs.append(t)

    async def requests():
        yield {"model_name": "dflash", "inputs": inputs}

    text, last = [], {}
    async for result, err in grpcclient.InferenceServerClient(url).stream_infer(inputs_iterator=requests()):
        assert err is None, err
        resp = result.get_response()
        if resp.outputs:
            text.append(result.as_numpy("text_output")[0].decode())
            last = {o.name: result.as_numpy(o.name) for o in resp.outputs}
    return "".join(text), last


@pytest.mark.slow
def test_a_laguna_drafter_serves_the_reference_text_and_rounds(tmp_path):
    with served_pair(tmp_path, laguna=True) as (recipe, server):
        assert read_json(recipe.drafter.path / "config.json")["architectures"] == [LAGUNA_ARCH]
        text, last = asyncio.run(complete(server.endpoints.grpc_url, PROMPT, 24))
    tok, target, drafter = loaded_pair(recipe.target.path, recipe.drafter.path)
    assert drafter.cfg.laguna and drafter.cfg.gate
    ids = tok(PROMPT)["input_ids"]
    want = generate(target, drafter, [ids], 24, block_size=recipe.speculative.block_size)[0]
    assert text == tok.decode(want.tokens)
    assert text == tok.decode(generate(target, None, [ids], 24, mode="ar")[0].tokens)  # lossless
    # it speculated: every round verified drafts (random weights: the target accepts none of them, so
    # the drafts themselves are checked in tests/reference/test_laguna.py, tp 1 against tp 2)
    assert int(last["total_draft_tokens"][0]) >= len(want.stats.accepted_per_round)
    assert float(last["acceptance_length"][0]) == pytest.approx(want.stats.tau)
