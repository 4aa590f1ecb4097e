"""Start and stop a real Triton Inference Server on a model repository.

On a CPU machine the server is the one bundled with nvidia-pytriton (tritonserver binary,
Python backend and per-version backend stubs). It runs in a private workspace (a temp dir
with the binaries and the stub matching this interpreter), bound to loopback by default,
in its own process group so that shutdown leaves no process behind. Two environment fixes
are applied: LD_LIBRARY_PATH starts with this interpreter's LIBDIR (otherwise the stub may
load a system libpython of another patch release) and the bundled libraries. Under numpy 2 the
bundled stub (Triton 24.10, pybind11 2.10) cannot exchange tensors with numpy (compat.py), so
it runs on an interpreter overlay whose numpy is a numpy < 2 and whose other packages are this
environment's (launch/stub_python.py).

On GPU machines the server comes from NVIDIA's container; launch/node_command.py renders the
command on one node, launch/cluster.py the Slurm and Kubernetes launchers across nodes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash import compat
from trtllm_dflash.errors import UserError
from trtllm_dflash.launch.stub_python import stub_interpreter
from trtllm_dflash.recipe.schema import same_ports


@dataclass(frozen=True)
class Endpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    def __post_init__(self) -> None:
        clash = same_ports(self.http_port, self.grpc_port, self.metrics_port)
        if clash:
            raise UserError(f"serve: {clash}")

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> "Endpoints":
        """Three different free ports on `host` (free_port three times can hand out one port twice:
        the kernel may reuse a port the moment its probe socket closes)."""
        return cls(host, *free_ports(3, host))

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"


def bundled_server() -> tuple[Path, Path]:
    """(tritonserver distribution dir, bundled shared libraries dir) from nvidia-pytriton."""
    try:
        import pytriton
    except ImportError:
        raise UserError("serve needs nvidia-pytriton (it bundles tritonserver): pip install "
                        "'trtllm_dflash[serve]'") from None
    root = Path(pytriton.__file__).parent
    dist = root / "tritonserver"
    libs = root.parent / "nvidia_pytriton.libs"
    if not (dist / "bin" / "tritonserver").exists():
        raise UserError(f"nvidia-pytriton at {root} has no bundled tritonserver binary")
    return dist, libs


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` different free ports: every probe socket stays bound until all are chosen."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the launching process dies (Linux), so a killed
    caller (a test runner hitting its timeout, say) never leaves a server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class TritonServer:
    """A tritonserver process on `repository`; use as a context manager or call start()/stop()."""

    def __init__(self, repository: Path, endpoints: Endpoints, log_verbose: int = 0, env: dict[str, str] | None = None):
        self.repository = Path(repository)
        self.endpoints = endpoints
        self.log_verbose = log_verbose
        self.extra_env = dict(env or {})  # added to the server's environment (e.g. serve/trace.py's TRACE_ENV)
        self.workspace: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        assert self.workspace is not None
        return self.workspace / "tritonserver.log"

    def _prepare_workspace(self) -> Path:
        dist, _ = bundled_server()
        ws = Path(tempfile.mkdtemp(prefix="trtllm-dflash-triton-"))
        shutil.copytree(dist / "bin", ws / "bin")
        shutil.copytree(dist / "caches", ws / "caches")
        py = ws / "backends" / "python"
        py.mkdir(parents=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy(dist / "backends" / "python" / name, py / name)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise UserError(f"nvidia-pytriton ships no Python backend stub for Python {version}")
        shutil.copy(stub, py / "triton_python_backend_stub")
        if compat.numpy_2():
            stub_interpreter(ws / "stub-python", compat.stub_numpy_dir())
        return ws

    def command(self) -> list[str]:
        assert self.workspace is not None
        e = self.endpoints
        return [
            str(self.workspace / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.workspace / 'backends'}",
            f"--cache-directory={self.workspace / 'caches'}",
            f"--http-address={e.host}",
            f"--grpc-address={e.host}",
            f"--metrics-address={e.host}",
            f"--http-port={e.http_port}",
            f"--grpc-port={e.grpc_port}",
            f"--metrics-port={e.metrics_port}",
            "--disable-auto-complete-config",
            # Explicit model control: a model that can no longer serve (a dead tensor-parallel rank)
            # marks itself unavailable (triton_model.mark_unavailable); every model loads at start.
            "--model-control-mode=explicit",
            "--load-model=*",
            # A clean unload takes ~3 s (the Python backend stops its stub); a stream the client left
            # half-closed can hold the model until the timeout, so do not wait long for it.
            "--exit-timeout-secs=4",
            f"--log-verbose={self.log_verbose}",
        ]

    def _env(self) -> dict[str, str]:
        _, libs = bundled_server()
        env = os.environ.copy()
        paths = [sysconfig.get_config_var("LIBDIR") or "", str(libs), env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = ":".join(p for p in paths if p)
        # The stub takes its site-packages from the `python3` first on PATH (a venv's pyvenv.cfg).
        overlay = self.workspace / "stub-python" / "bin" if self.workspace else None
        bindir = overlay if overlay is not None and overlay.is_dir() else Path(sys.executable).parent
        env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 120.0) -> "TritonServer":
        e = self.endpoints
        if not (self.repository.is_dir() and any(self.repository.iterdir())):
            raise UserError(f"{self.repository}: not a Triton model repository (empty or missing)")
        for field, port in (("http_port", e.http_port), ("grpc_port", e.grpc_port), ("metrics_port", e.metrics_port)):
            if port_in_use(e.host, port):
                raise UserError(f"serve.{field}: {e.host}:{port} is already in use")
        self.workspace = self._prepare_workspace()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=self._env(), start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                reason = self.failure_reason()
                self.stop()
                raise UserError(f"tritonserver exited with code {self.proc.returncode} during start-up: {reason}")
            if self.ready():
                return self
            time.sleep(0.25)
        reason = self.failure_reason()
        self.stop()
        raise UserError(f"tritonserver not ready after {timeout_s:.0f} s: {reason}")

    def ready(self) -> bool:
        """Our server is up: its own log says it bound both endpoints, and HTTP health says ready
        (the log check keeps another process on the same port from passing as ours)."""
        e = self.endpoints
        try:
            log = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        if f"Started HTTPService at {e.host}:{e.http_port}" not in log or f"at {e.host}:{e.grpc_port}" not in log:
            return False
        url = f"http://{e.http_url}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def failure_reason(self) -> str:
        """The most telling lines of the server log (errors first)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except (OSError, AssertionError):
            return "no log"
        if lines and lines[0].startswith("Usage: tritonserver"):
            # It refused its command line; the usage text it prints says nothing about why.
            return f"tritonserver refused its command line (it printed its usage): {' '.join(self.command()[1:])}"
        # NVML / DCGM complaints are normal on a machine without GPUs.
        lines = [line for line in lines if "NVML" not in line and "DCGM" not in line]
        errors = [line for line in lines if line.startswith("E") or "error" in line.lower()]
        keep = errors[-3:] or lines[-3:]
        return " | ".join(line.strip()[:300] for line in keep)

    def stop(self) -> None:
        """SIGTERM the server (it unloads its models, and so stops its Python stubs), escalate to the
        process group, remove the workspace. Only the server: a stub that gets SIGTERM too dies
        before its model's finalize, and the server then waits out its exit timeout (4.9 s per stop
        against 3.8 s, measured)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            # Stubs can outlive a killed server for a moment; make sure the group is gone.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.workspace is not None:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
