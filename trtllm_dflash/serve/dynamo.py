"""The reference backend as an NVIDIA Dynamo engine: `serve --api dynamo` (ai-dynamo 1.6.1).

    trtllm-dflash serve RECIPE --from DEPLOY_DIR --api dynamo [--namespace dynamo] [--discovery-backend file]
    python -m dynamo.frontend --discovery-backend file --http-host 127.0.0.1 --http-port 8000

A Dynamo worker (dynamo.common.backend.LLMEngine, driven by dynamo.common.backend.run) over the
same deployment, loader and in-flight batching ServingEngine as the Triton model and our OpenAI
server (serve/deployed.py, serve/batcher.py): Dynamo's frontend and router in front, our engine
behind, no second loop. Dynamo's frontend tokenizes (chat: with the chat template the worker
registers) and detokenizes; the worker takes token ids and streams token-id deltas back.

Registration: the served name is the recipe's serve.model_name; the model card is a directory the
worker writes at start-up (`model_card`, under $TMPDIR/trtllm-dflash-dynamo/, named by its
contents, so every worker of a deployment registers the same one, as Dynamo's frontend requires):
the deployment's tokenizer files beside the target's Hugging Face config.json (Dynamo 1.6.1 reads
config.json from the model directory and refuses one without it); a tokenizer without a chat
template gets FALLBACK_CHAT_TEMPLATE (serve/requests.py, our OpenAI server's) through the
worker's custom jinja template option: a worker that advertises chat without a template never
registers.

Requests (dynamo_request.py): what our OpenAI server refuses, and what the loaded runners cannot
decode, fail with Dynamo's InvalidArgument, an HTTP 400 with our one line through the frontend;
the decoding per request through nvext.annotations (`dflash.mode=ar`, `dflash.draft_len=3`); a
finished request's acceptance in `engine_data` (the client asks nvext.extra_fields
["engine_data"]): our OpenAI server's `speculative_decoding` object, `avg_decoded_tokens_per_iter`
and `dflash`. A failed round ends its requests with Dynamo's Unknown (HTTP 500). The client
leaving (Dynamo calls `abort`, or stops reading) cancels the request: the engine drops it at its
next round. SIGINT / SIGTERM: Dynamo's runtime unregisters the worker, then `cleanup` closes
the deployment; the command prints `stopped`. The serving engine's speculative-decoding counters
(serve/metrics.py) are on the worker's /metrics (Dynamo's system server: DYN_SYSTEM_PORT).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from dynamo.common.backend import EngineConfig, LLMEngine, LlmRegistration, WorkerConfig
from dynamo.llm.exceptions import InvalidArgument, Unknown

from trtllm_dflash.serve.dynamo_request import Served, engine_data, finish_reason
from trtllm_dflash.serve.record import Request, draft_bound
from trtllm_dflash.serve.requests import FALLBACK_CHAT_TEMPLATE, RequestError

CARD_CONFIG = "config.json"
TEMPLATE = "chat_template.jinja"


def model_card(tokenizer_dir: Path, hf_config: dict, chat_template: str | None, root: Path) -> tuple[Path, Path | None]:
    """Dynamo's model directory for this deployment under `root`: the tokenizer's files, the
    target's Hugging Face config.json and, where the tokenizer has no chat template,
    FALLBACK_CHAT_TEMPLATE. Returns (the directory, the custom template in it or None).

    Dynamo's frontend takes the workers of one model only while their model cards agree, paths
    included (1.6.1 rejects "incompatible workers" otherwise), so every worker of a deployment
    must register the same directory: it is named by the hash of what it holds, written once
    (atomically: workers start together) and kept."""
    files = {f.name: f.read_bytes() for f in sorted(Path(tokenizer_dir).iterdir()) if f.is_file()}
    files[CARD_CONFIG] = json.dumps(hf_config, indent=1).encode()
    if not chat_template:
        files[TEMPLATE] = FALLBACK_CHAT_TEMPLATE.encode()
    digest = hashlib.sha256(b"".join(hashlib.sha256(k.encode() + b"\0" + v).digest() for k, v in files.items()))
    card = Path(root) / digest.hexdigest()[:16] / "model"
    if not card.is_dir():
        card.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=card.parent, prefix=".model-"))
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        try:
            tmp.rename(card)
        except OSError:  # another worker of the deployment wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    return card, (card / TEMPLATE if not chat_template else None)


class DFlashEngine(LLMEngine):
    """A Dynamo LLMEngine over one deployment (serve/deployed.py Deployed), opened by `opener()` in
    `start` and closed in `cleanup`."""

    def __init__(self, opener, name: str, card: Path, on_ready=None):
        self.opener, self.name, self.card, self.on_ready = opener, name, card, on_ready
        self.deployed = self.served = self.metrics = None
        self.live: dict[str, threading.Event] = {}  # request id -> set when its client left
        self.worker_id = None

    @classmethod
    async def from_args(cls, argv=None):
        raise NotImplementedError("started by `trtllm-dflash serve --api dynamo` (run_worker)")

    async def start(self, worker_id: int) -> EngineConfig:
        from trtllm_dflash.serve.metrics import PrometheusInstruments, SpecMetrics

        self.deployed = d = await asyncio.to_thread(self.opener)
        self.metrics = PrometheusInstruments()
        d.engine.metrics = SpecMetrics(self.metrics, self.name)
        self.served = Served(d.limits, len(d.tokenizer), d.model.capabilities, d.engine.ddtree_budget)
        self.worker_id = worker_id
        if self.on_ready is not None:
            self.on_ready(worker_id)
        return EngineConfig(model=str(self.card), served_model_name=self.name,
                            llm=LlmRegistration(context_length=d.limits.max_seq_len,
                                                max_num_seqs=d.engine.max_batch_size))

    async def register_prometheus(self, metrics) -> None:
        from dynamo.common.backend.metrics import register_engine_registry

        if self.metrics is not None:
            register_engine_registry(metrics, self.metrics.registry)

    async def generate(self, request, context):
        try:
            asked = self.served.parse(request)
        except RequestError as e:
            raise InvalidArgument(str(e)) from None
        engine = self.deployed.engine
        loop, updates, gone = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()
        rid = context.id()
        self.live[rid] = gone
        mode = asked.mode or engine.mode
        engine.submit(Request(asked.prompt_ids, asked.max_tokens,
                              lambda u: loop.call_soon_threadsafe(updates.put_nowait, u), asked.sampling,
                              stop_token_ids=asked.stop_token_ids, stop_words=asked.stop_words,
                              cancelled=gone.is_set, draft_len=asked.draft_len, mode=asked.mode, tag=rid))
        done = False
        try:
            while not done:
                update = await updates.get()
                done = update.finish_reason is not None
                if done and update.finish_reason.startswith("error"):
                    print(f"dynamo worker: request {rid} failed: {update.finish_reason}", file=sys.stderr, flush=True)
                    raise Unknown(update.finish_reason)
                chunk = {"token_ids": list(update.ids), "index": 0}
                if done:
                    n = len(asked.prompt_ids)
                    chunk.update(finish_reason=finish_reason(update.finish_reason),
                                 completion_usage={"prompt_tokens": n, "completion_tokens": update.total_tokens,
                                                   "total_tokens": n + update.total_tokens},
                                 engine_data=engine_data(update, mode, asked.draft_len, draft_bound(engine, mode)))
                if chunk["token_ids"] or done:
                    yield chunk
        finally:
            if not done:
                gone.set()  # the client left (Dynamo stopped reading): the engine drops it at its next round
            self.live.pop(rid, None)

    async def abort(self, context) -> None:
        gone = self.live.get(context.id())
        if gone is not None:
            gone.set()

    async def cleanup(self) -> None:
        deployed, self.deployed = self.deployed, None
        if deployed is not None:
            await asyncio.to_thread(deployed.close)


def run_worker(version_dir: Path, settings, name: str, namespace: str, discovery_backend: str, host: str) -> None:
    """Serve the deployment as a Dynamo worker until SIGINT / SIGTERM (Dynamo's runtime owns them):
    prints `ready: dynamo worker ...` once registered, and returns after the worker's cleanup.
    `host`: the address of its request plane, response streams, event plane and system server
    (LOOPBACK_ENV's variables, where the environment does not set them)."""
    import os

    from dynamo.common.backend.run import run

    from trtllm_dflash.launch.dynamo_local import LOOPBACK_ENV

    for var in LOOPBACK_ENV:
        os.environ.setdefault(var, host)

    from trtllm_dflash.runtime.checkpoint import read_checkpoint
    from trtllm_dflash.serve.deployed import deploy_dir_of, open_deployed

    s = settings.resolved(deploy_dir_of(version_dir))
    info = read_checkpoint(Path(s.checkpoint))
    hf_config = json.loads((info.directory / "target" / CARD_CONFIG).read_text())["hf_config"]
    card, template = model_card(info.tokenizer_dir, hf_config, _chat_template(info.tokenizer_dir),
                                Path(tempfile.gettempdir()) / "trtllm-dflash-dynamo")
    cfg = WorkerConfig(namespace=namespace, model_name=str(card), served_model_name=name,
                       discovery_backend=discovery_backend, custom_jinja_template=str(template) if template else None)

    def ready(worker_id):
        print(f"ready: dynamo worker {worker_id} serving {name!r} in namespace {namespace!r} "
              f"({discovery_backend} discovery)", flush=True)

    engine = DFlashEngine(lambda: open_deployed(version_dir, settings), name, card, ready)

    async def factory(_argv):
        return engine, cfg

    run(DFlashEngine, engine_factory=factory)


def _chat_template(tokenizer_dir: Path) -> str | None:
    """The tokenizer's own chat template: tokenizer_config.json's chat_template, or chat_template.jinja
    (transformers' two homes for it), else None."""
    beside = Path(tokenizer_dir) / TEMPLATE
    if beside.is_file():
        return beside.read_text()
    config = Path(tokenizer_dir) / "tokenizer_config.json"
    return json.loads(config.read_text()).get("chat_template") if config.is_file() else None
