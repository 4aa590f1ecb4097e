"""NVIDIA Dynamo's frontend and our reference workers on this machine: what docs/guides/dynamo.md's
CPU section runs by hand, for the tests and perf/bench_dynamo.py.

    with LocalDynamo(deploy_dir, work_dir) as dyn:   # the frontend, on a free 127.0.0.1 port
        dyn.add_worker(); dyn.add_worker()            # `trtllm-dflash serve --api dynamo`, each
        dyn.wait_for_workers(2)                       # registered: the frontend routes to both
        ... http://127.0.0.1:{dyn.port}/v1 ...

File discovery (`--discovery-backend file`, the directory $DYN_FILE_KV = WORK/kv), so no etcd or
NATS; every address Dynamo 1.6.1 lets us choose is 127.0.0.1 (LOOPBACK_ENV, the frontend's
--http-host). Its event plane's ZMQ PUB sockets still bind every interface (no setting for
that), so run this in a loopback-only network namespace (`unshare -n`) where reaching beyond the
machine matters. HOME is WORK/home (Dynamo keeps its model-card cache under $HOME/.cache/dynamo) and
TMPDIR WORK/tmp (where the workers write the model card they register: serve/dynamo.py).
Each process runs in a session of its own, is stopped by its process group (SIGTERM, then
SIGKILL) and gets SIGTERM should the launching process die first: nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError

# The addresses Dynamo 1.6.1 lets a process choose, by environment variable (its runtime reads them;
# a worker's request plane, response streams, advertised event plane, system server): `serve --api
# dynamo` sets them to --host where they are unset.
LOOPBACK_ENV = {"DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1"}
NAMESPACE = "dynamo"


@dataclass
class Worker:
    proc: subprocess.Popen
    worker_id: int  # Dynamo's instance id (its responses' nvext.worker_id)
    log: Path
    system_port: int  # Dynamo's system server of the worker: /health, /metrics (ours among them)


def stop_group(procs: list[subprocess.Popen], grace_s: float = 20.0) -> None:
    """Stop processes started in sessions of their own, each with its whole process group: SIGTERM
    to all of them, then SIGKILL to what is left after `grace_s`."""
    def signal_group(proc, sig):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    for proc in procs:
        if proc.poll() is None:
            signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        signal_group(proc, signal.SIGKILL)
        proc.wait()


def _system_port() -> int:
    """A free port for a worker's system server below 32768: Dynamo 1.6.1 reads DYN_SYSTEM_PORT as
    a 16-bit signed integer (it refuses "invalid value unsigned int ..., expected i16" above), and
    the kernel hands out ephemeral ports from 32768 up."""
    import random

    from trtllm_dflash.launch.server import port_in_use

    for _ in range(200):
        port = random.randrange(10000, 32768)
        if not port_in_use("127.0.0.1", port):
            return port
    raise UserError("no free port below 32768 for a Dynamo worker's system server")


def http_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


class LocalDynamo:
    """The frontend on 127.0.0.1:`port` (a free one by default) and the workers added to it."""

    def __init__(self, deploy_dir: Path, work: Path, recipe: list[str] = (), port: int | None = None,
                 model: str = "dflash", env: dict[str, str] | None = None):
        from trtllm_dflash.launch.server import free_port

        self.deploy_dir, self.work, self.recipe, self.model = Path(deploy_dir), Path(work), list(recipe), model
        self.port = port or free_port()
        for sub in ("home", "tmp"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **LOOPBACK_ENV, "DYN_FILE_KV": str(self.work / "kv"), "HOME": str(self.work / "home"),
                    "TMPDIR": str(self.work / "tmp"), **(env or {})}
        self.frontend: subprocess.Popen | None = None
        self.workers: list[Worker] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, cmd: list[str], log: Path, **env) -> subprocess.Popen:
        from trtllm_dflash.launch.server import _die_with_parent

        with log.open("w") as out:
            return subprocess.Popen(cmd, env={**self.env, **env}, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_die_with_parent)

    def start(self) -> "LocalDynamo":
        self.frontend = self._spawn([sys.executable, "-m", "dynamo.frontend", "--discovery-backend", "file",
                                     "--namespace", NAMESPACE, "--http-host", "127.0.0.1",
                                     "--http-port", str(self.port),
                                     "--router-mode", "round-robin"], self.work / "frontend.log")
        return self

    def add_worker(self, timeout_s: float = 180.0) -> Worker:
        """One more worker over the deployment; returns once it printed its `ready:` line."""
        log, port = self.work / f"worker-{len(self.workers)}.log", _system_port()
        proc = self._spawn([sys.executable, "-m", "trtllm_dflash", "serve", *self.recipe,
                            "--from", str(self.deploy_dir),
                            "--api", "dynamo", "--discovery-backend", "file", "--namespace", NAMESPACE], log,
                           DYN_SYSTEM_PORT=str(port))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            ready = [line for line in log.read_text(errors="replace").splitlines()
                     if line.startswith("ready: dynamo worker ")]
            if ready:
                worker = Worker(proc, int(ready[0].split()[3]), log, port)
                self.workers.append(worker)
                return worker
            time.sleep(0.1)
        stop_group([proc])
        raise UserError(f"the Dynamo worker did not start: {log.read_text()[-2000:]}")

    def wait_for_workers(self, n: int, timeout_s: float = 120.0) -> None:
        """Until the frontend lists the model and routes to `n` live instances."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                models = [m["id"] for m in http_json(f"{self.url}/v1/models")["data"]]
                live = http_json(f"{self.url}/health").get("instances") or []
            except (OSError, ValueError):
                models, live = [], []
            if self.model in models and len(live) >= n:
                return
            if self.frontend.poll() is not None:
                break
            time.sleep(0.2)
        log = (self.work / "frontend.log").read_text()[-2000:]
        raise UserError(f"Dynamo's frontend does not route to {n} workers: {log}")

    def stop(self) -> None:
        """The workers first (they unregister), then the frontend."""
        stop_group([w.proc for w in self.workers])
        if self.frontend is not None:
            stop_group([self.frontend])

    def __enter__(self) -> "LocalDynamo":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
