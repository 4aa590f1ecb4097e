"""A sweep ends when the server stops answering: a Triton Python stub that dies mid-request
leaves its decoupled streams open forever, which once hung CI for 600 s per test."""

import asyncio
import time

from trtllm_dflash.sweep.loadgen import _consume
from trtllm_dflash.sweep.metrics import RequestRecord


async def _one_chunk_then_silence():
    yield {"output_token_count": 2, "text_output": b"hi", "rounds": 1, "total_draft_tokens": 3}
    await asyncio.sleep(3600)  # the server's stub is gone; nothing closes the stream
    yield {"finish_reason": "length"}


def test_a_silent_stream_fails_the_request_after_the_stall_timeout():
    rec = RequestRecord(request_id=0, concurrency=1, start_ns=0)
    t0 = time.perf_counter()
    asyncio.run(_consume(rec, _one_chunk_then_silence(), stall_s=0.2))
    assert time.perf_counter() - t0 < 5  # 0.2 s of silence, not the stream's hour
    assert rec.error == "no response from the server for 0.2 s"
    assert rec.chunk_tokens == [2] and rec.text == "hi"  # what arrived is kept


def test_a_finished_stream_is_not_a_failure():
    async def events():
        yield {"output_token_count": 1, "text_output": "a"}
        yield {"output_token_count": 1, "text_output": "b", "finish_reason": "length"}

    rec = RequestRecord(request_id=0, concurrency=1, start_ns=0)
    asyncio.run(_consume(rec, events(), stall_s=0.2))
    assert rec.error is None and rec.text == "ab"
