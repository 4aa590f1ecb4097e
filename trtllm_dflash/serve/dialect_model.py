"""The `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm` models: thin Triton Python models that
speak tensorrtllm_backend's dialect (deploy/dialect.py) and forward every request to the
deployment's `dflash` model over decoupled BLS.

Why BLS: each Python model runs in a stub process of its own, so a model that loaded the pair
itself would hold a second copy of the weights and its own KV pool and scheduler. Forwarding keeps
one decoder, one in-flight batch and one KV pool for every interface, and costs a local
round trip per response. Upstream's `tensorrt_llm_bls` does the same towards its `tensorrt_llm`
model (TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/
triton_decoder.py`, commit 07f3e442: `_exec_triton_request` runs `exec(decoupled=True)`).

Each request is forwarded on a thread of its own, so `execute` returns at once and one model
instance carries any number of concurrent streams. The dflash model sends its final flag with
its last data response (`finish_reason` set); that response goes out here with the final flag
too. A client that leaves cancels the forwarded request where this Python backend can
(ResponseIterator.cancel, Triton >= 24.07), else dflash finishes it and the answer is dropped.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_dflash.serve.dialect import Forward, is_last, to_dflash_batch, to_dialect
from trtllm_dflash.serve.requests import RequestError, read_inputs

CANCEL_CHECK_S = 0.05  # is_cancelled() is a round trip to the server: asked at most this often
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Graveyard:
    """Finished BLS response iterators, held until the stub no longer holds them.

    The Python stub of the tritonserver nvidia-pytriton 0.7.0 bundles (python_backend r24.10)
    keeps each decoupled BLS iterator in a map too, and erases it on its stub-to-parent thread
    once the iterator has returned its final response (src/pb_stub.cc Stub::SendCleanupId). If that
    erase drops the last reference, ~ResponseIterator frees the responses' numpy arrays on that
    thread without the GIL (~PbTensor): under Python 3.12 a segfault in _PyObject_Free that kills
    the stub ("Stub process 'ensemble_0_0' is not healthy"), under 3.11 a silent data race.
    Fixed upstream by triton-inference-server/python_backend PR #390 (r25.01: ~PbTensor takes the
    GIL); the NGC containers we ship into carry the fix, the CPU server we test on does not.

    That thread serves its queue in order, and is_cancelled() queues a query on it and waits for
    the answer. So once a query queued after an iterator's cleanup has been answered, the stub has
    let the iterator go and ours is the last reference: dropped here, with the GIL held. The query
    must come before the request's final response, which lets the server free what it asks about.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._parked = []

    def park(self, responses) -> None:
        """Hold a finished iterator until a later bury()."""
        with self._lock:
            self._parked.append(responses)

    def bury(self, sender, responses) -> None:
        """`responses` has returned its final response and `sender` has not sent its own: drop
        every iterator parked so far once a cancellation query on `sender` has made the round trip."""
        with self._lock:
            batch, self._parked = self._parked + [responses], []
        try:
            answered = not sender.is_cancelled()  # True may come from its cache, without a round trip
        except Exception:  # the stub is shutting down: no round trip either
            answered = False
        if not answered:
            with self._lock:
                self._parked.extend(batch)


GRAVEYARD = _Graveyard()


def _error(sender, message: str) -> None:
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)


class _Shared:
    """A client request's response sender, shared by the forwards of its prompts (one per prompt of
    a batched request): each forward's last send is final for it, and the last forward to end sends
    Triton's final flag. Sends are serialized; a forward that has ended sends nothing more."""

    def __init__(self, sender, n: int):
        self.sender, self.left, self.lock = sender, n, threading.Lock()

    def part(self) -> "_Part":
        return _Part(self)

    def send(self, part: "_Part", response, flags: int) -> None:
        with self.lock:
            if part.ended:
                return
            if flags & FINAL:
                part.ended, self.left = True, self.left - 1
                flags = FINAL if self.left == 0 else 0
                if response is None and not flags:
                    return  # an empty end of one prompt: nothing to tell the client yet
            self.sender.send(response, flags=flags) if response is not None else self.sender.send(flags=flags)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


class _Part:
    """One forward's view of a _Shared sender, with the response sender's send / is_cancelled."""

    def __init__(self, shared: _Shared):
        self.shared, self.ended = shared, False

    def send(self, response=None, flags: int = 0) -> None:
        self.shared.send(self, response, flags)

    def is_cancelled(self) -> bool:
        return self.shared.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        self.name, self.kind, self.target = args["model_name"], params["dialect"], params["dflash_model"]
        self.inputs = [t["name"] for t in cfg["input"]]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = read_inputs(pb_utils.get_input_tensor_by_name, request, self.inputs)
                fwds = to_dflash_batch(self.kind, inputs, request.requested_output_names(), now_ns=time.time_ns())
            except RequestError as e:
                _error(sender, str(e))
                continue
            shared = _Shared(sender, len(fwds))
            for fwd in fwds:
                # Our own id for the forwarded request: a `stop` request names it (client ids need not be unique).
                forward_id = f"{self.name}-{uuid.uuid4().hex}"
                threading.Thread(target=self._forward, args=(fwd, shared.part(), forward_id),
                                 name=f"{self.name}-forward", daemon=True).start()
        return None

    def _forward(self, fwd: Forward, sender, request_id: str) -> None:
        try:
            self._relay(fwd, sender, request_id)
        except Exception as e:  # the client left, or dflash went away: the model keeps serving
            pb_utils.Logger.log_warn(f"{self.name}: request {request_id!r} ended early: {type(e).__name__}: {e}")
            try:
                _error(sender, f"{self.name}: {type(e).__name__}: {e}")
            except Exception:
                pass

    def _relay(self, fwd: Forward, sender, request_id: str) -> None:
        bls = pb_utils.InferenceRequest(
            model_name=self.target, request_id=request_id, requested_output_names=fwd.dflash_outputs,
            inputs=[pb_utils.Tensor(n, v) for n, v in fwd.inputs.items()])
        responses = bls.exec(decoupled=True)
        checked = time.monotonic()
        for response in responses:
            if response.has_error():  # dflash's errors are final responses
                GRAVEYARD.bury(sender, responses)
                _error(sender, response.error().message())
                return
            outs = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if not outs:  # dflash's empty final response: the request was stopped
                break
            last = is_last(outs)
            out = [pb_utils.Tensor(n, v) for n, v in to_dialect(fwd, outs, time.time_ns()).items()]
            if last:
                GRAVEYARD.bury(sender, responses)
            sender.send(pb_utils.InferenceResponse(out), flags=FINAL if last else 0)
            if last:
                return
            if time.monotonic() - checked >= CANCEL_CHECK_S:
                checked = time.monotonic()
                if sender.is_cancelled():
                    self._cancel(request_id)
                    for _ in responses:  # on to dflash's final response, after which the stub lets it go
                        pass
                    GRAVEYARD.park(responses)  # this sender's query answers from its cache now
                    sender.send(flags=FINAL)
                    return
        GRAVEYARD.bury(sender, responses)
        sender.send(flags=FINAL)

    def _cancel(self, request_id: str) -> None:
        """The client left: cancel the forwarded request. Triton's BLS response iterator has no
        cancel() before triton-inference-server/python_backend PR #398 (the bundled 24.10 stub has
        none), so dflash is told with a `stop` request naming the forwarded request's id, as
        upstream's BLS stops its tensorrt_llm requests (triton_decoder.py send_cancellation_request)."""
        stop = pb_utils.InferenceRequest(
            model_name=self.target, request_id=request_id, requested_output_names=["finish_reason"],
            inputs=[pb_utils.Tensor("stop", np.array([True])), pb_utils.Tensor("max_tokens", np.array([1], np.int32))])
        responses = stop.exec(decoupled=True)
        answer = list(responses)
        GRAVEYARD.park(responses)
        error = next((r.error().message() for r in answer if r.has_error()), None)
        pb_utils.Logger.log_info(f"{self.name}: client cancelled {request_id}: "
                                 + (f"dflash did not stop it ({error})" if error else "dflash request stopped"))

    def finalize(self):
        pass
