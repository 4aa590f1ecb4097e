"""run_sweep's progress: what a sweep shows while it runs (scripted levels, no server)."""

from trtllm_dflash.sweep import loadgen
from trtllm_dflash.sweep.metrics import RequestRecord


def test_off_a_terminal_the_sweep_prints_one_line_per_finished_run(monkeypatch, capsys):
    """rich draws no progress bars into a log or a pipe (`bench policy` ran 50 minutes silent):
    there every finished run of a curve at a level prints its own line, with what it measured, and
    the bars are not dumped at the end."""
    async def fake_level(url, model, prompts, c, n, warmup, max_tokens, seed, temperature, *, on_done, variant,
                         repeat, **_):
        recs = []
        for i in range(n):  # request i streams 1 + 10 tokens over 10 chunks of (c + i) ms: 1000 / (c + i) tok/s
            step = (c + i) * 1_000_000
            rec = RequestRecord(request_id=i, concurrency=c, start_ns=0, chunk_ns=[step * (k + 1) for k in range(11)],
                                chunk_tokens=[1] * 11, end_ns=step * 11, curve=variant.name, repeat=repeat)
            on_done(rec)
            recs.append(rec)
        return recs

    monkeypatch.setattr(loadgen, "run_level", fake_level)
    variants = [loadgen.Variant("ar", "ar"), loadgen.Variant("dflash L=3", "dflash", 3)]
    result = loadgen.run_sweep("127.0.0.1:9", "m", [1, 4], lambda c: 3, 0, ["p"], 10, gpus=1, variants=variants)
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if "tok/s/user p50" in line]
    assert len(lines) == len(out) == 4  # 2 curves x 2 levels x 1 repeat, in the order they ran; no bars
    assert [line.split()[0] for line in lines] == ["ar", "dflash", "ar", "dflash"]
    for line, c in zip(lines, (1, 1, 4, 4)):
        assert f"c={c} " in line and f"{1000 / (c + 1):.1f} tok/s/user p50" in line  # the median request's rate
    assert len(result.repeats) == 4
