"""NVIDIA Dynamo's real frontend and our workers (launch/dynamo_local.py) inside a loopback-only
network namespace, driven from the test process outside it.

Dynamo 1.6.1's event plane binds ZMQ sockets on every interface, so the frontend and the workers
run in a namespace of their own (`unshare -n`: only its own loopback) under one launcher process,
`python dynamo_helpers.py` (`_launcher`). The test process reaches the frontend through two
forwarders over a Unix socket, which no network namespace separates: outside, 127.0.0.1:PORT of
the host's loopback -> WORK/http.sock; inside, WORK/http.sock -> the frontend's 127.0.0.1 port.
So the tests, `sweep` and the openai client speak plain http://127.0.0.1:PORT.

The launcher answers on stdout with one JSON line per event ({"ready": ...}, {"worker": ...},
{"get": ...}) and takes commands on stdin ("add": one more worker; "get URL": that URL fetched
inside, such as a worker's /metrics); SIGTERM, or its stdin closing, stops the whole cluster.
Its children get SIGTERM if it dies (PR_SET_PDEATHSIG), and teardown kills its
process group: nothing is left behind.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve()


def skip_reason() -> str | None:
    """Why the Dynamo tests cannot run here, in one line (None: they can)."""
    if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.frontend") is None:
        return ("needs NVIDIA Dynamo 1.6.1: pip install -e '.[dynamo]' && pip install --no-deps ai-dynamo==1.6.1 "
                "(docs/compat.md)")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2): Dynamo runs in a loopback-only network namespace"
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        return "unshare -n is not permitted here (needs root or user namespaces): Dynamo binds every interface"
    return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def _bridge(connect):
    """A connection handler that pipes both ways to what `connect()` opens."""
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await connect()
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    return handle


# ---------------------------------------------------------------------------- inside the namespace


def _launcher(deploy: str, work: str, recipe: list[str], workers: int) -> None:
    from trtllm_dflash.launch.dynamo_local import LocalDynamo

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    dyn = LocalDynamo(Path(deploy), Path(work), recipe, env={"DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0"})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    say = lambda **event: print(json.dumps(event), flush=True)  # noqa: E731
    worker = lambda w: {"pid": w.proc.pid, "worker_id": w.worker_id, "metrics": f"http://127.0.0.1:{w.system_port}/metrics"}  # noqa: E731

    def serve_socket():
        async def main():
            handle = _bridge(lambda: asyncio.open_connection("127.0.0.1", dyn.port))
            async with await asyncio.start_unix_server(handle, path=str(Path(work) / "http.sock")):
                await asyncio.to_thread(stop.wait)
        asyncio.run(main())

    def commands():
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            try:
                if command == "add":
                    w = dyn.add_worker()
                    dyn.wait_for_workers(len([x for x in dyn.workers if x.proc.poll() is None]))
                    say(worker=worker(w))
                elif command == "get":
                    with urllib.request.urlopen(arg, timeout=30) as r:
                        say(get=r.read().decode())
            except Exception as e:  # noqa: BLE001  (the test reads it as the command's answer)
                say(error=f"{type(e).__name__}: {e}")
        stop.set()

    try:
        dyn.start()
        for _ in range(workers):
            dyn.add_worker()
        dyn.wait_for_workers(workers)
        threading.Thread(target=serve_socket, daemon=True).start()
        say(ready={"frontend_pid": dyn.frontend.pid, "workers": [worker(w) for w in dyn.workers]})
        threading.Thread(target=commands, daemon=True).start()
        stop.wait()
    except Exception as e:  # noqa: BLE001  (one line for the test, then stop everything)
        say(error=f"{type(e).__name__}: {e}")
    finally:
        dyn.stop()


# ---------------------------------------------------------------------------- the test process


class DynamoCluster:
    """The launcher in its namespace and the host-side forwarder: `url`, `workers`, `add_worker`."""

    def __init__(self, deploy: Path, work: Path, recipe: list[str] = (), workers: int = 2):
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.killed: str | None = None  # the log of a worker a test killed
        self.proc = subprocess.Popen(
            ["unshare", "-n", sys.executable, str(HERE), str(deploy), str(work), str(workers), *recipe],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(self.work / "launcher.log").open("w"),
            text=True, start_new_session=True, cwd=HERE.parents[2])
        ready = self._event()
        if "ready" not in ready:
            self.stop()
            raise RuntimeError(f"Dynamo did not start: {ready.get('error', ready)}; logs in {work}")
        self.workers = ready["ready"]["workers"]
        self.port = self._forward()
        self.url = f"http://127.0.0.1:{self.port}"

    def _event(self) -> dict:
        line = self.proc.stdout.readline()
        return json.loads(line) if line.strip() else {"error": "the launcher exited: " + (
            self.work / "launcher.log").read_text()[-3000:]}

    def _forward(self) -> int:
        """127.0.0.1:PORT on the host -> WORK/http.sock, served by a daemon thread of this process."""
        started, box = threading.Event(), {}
        sock = str(self.work / "http.sock")

        def run():
            async def main():
                server = await asyncio.start_server(_bridge(lambda: asyncio.open_unix_connection(sock)), "127.0.0.1", 0)
                box["port"] = server.sockets[0].getsockname()[1]
                box["loop"], box["server"] = asyncio.get_running_loop(), server
                started.set()
                async with server:
                    await server.serve_forever()
            try:
                asyncio.run(main())
            except asyncio.CancelledError:
                pass
        threading.Thread(target=run, daemon=True).start()
        started.wait(10)
        self._server = box
        return box["port"]

    def _ask(self, command: str, key: str):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        event = self._event()
        if key not in event:
            raise RuntimeError(f"{command}: {event}")
        return event[key]

    def add_worker(self) -> dict:
        """One more worker, registered with the frontend: {"pid", "worker_id", "metrics"}."""
        self.workers.append(self._ask("add", "worker"))
        return self.workers[-1]

    def get_inside(self, url: str) -> str:
        """GET a URL inside the namespace (a worker's /metrics)."""
        return self._ask(f"get {url}", "get")

    def stop(self) -> None:
        server = getattr(self, "_server", {})
        if server:
            server["loop"].call_soon_threadsafe(server["server"].close)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


if __name__ == "__main__":
    _deploy, _work, _n, *_recipe = sys.argv[1:]
    _launcher(_deploy, _work, _recipe, int(_n))
