"""Start and stop a real Triton Inference Server on a model repository.

On a CPU machine the server is the one bundled with nvidia-pytriton (tritonserver binary,
Python backend and per-version backend stubs). It runs in a private workspace (a temp dir
with the binaries and the stub matching this interpreter), bound to loopback by default,
in its own process group so that shutdown leaves no process behind. Two environment fixes
are applied: LD_LIBRARY_PATH starts with this interpreter's LIBDIR (otherwise the stub may
load a system libpython of another patch release) and the bundled libraries. Under numpy 2 the
bundled stub (Triton 24.10, pybind11 2.10) cannot exchange tensors with numpy (compat.py), so
it runs on an interpreter overlay whose numpy is a numpy < 2 and whose other packages are this
environment's (`stub_interpreter`).

On GPU machines the server comes from NVIDIA's container; `launch_command` renders the
command on one node, launch/cluster.py the Slurm and Kubernetes launchers across nodes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
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

from packaging.version import InvalidVersion, Version

from trtllm_dflash import compat
from trtllm_dflash.deploy.settings import PATHS
from trtllm_dflash.errors import UserError
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
        raise UserError("serve needs nvidia-pytriton (it bundles tritonserver): pip install 'trtllm_dflash[serve]'") from None
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


def stub_interpreter(root: Path, numpy1: Path) -> Path:
    """A venv-shaped overlay at `root` for the bundled Python backend stub: this interpreter, the
    numpy < 2 in `numpy1` first, then this environment's site-packages (with their .pth hooks,
    so editable installs resolve). Returns its bin directory; a one-line error without numpy1."""
    version = _numpy_release(numpy1)
    if version is None or version.major >= 2:
        found = "no numpy" if version is None else f"numpy {version}"
        raise UserError(
            f"under numpy {compat.version_of('numpy')} the tritonserver bundled with nvidia-pytriton (Triton 24.10, "
            f"pybind11 2.10) corrupts every tensor; its Python stub needs a numpy < 2 of its own and {numpy1} has "
            f"{found}: run {compat.stub_numpy_hint(numpy1)} (or point ${compat.STUB_NUMPY_ENV} at one)")
    tag = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "lib" / tag / "site-packages"
    (root / "bin").mkdir(parents=True)
    site.mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(Path(sys.executable).resolve())
    (root / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).resolve().parent}\n"
                                     f"include-system-site-packages = false\nversion = {sys.version.split()[0]}\n")
    # .pth lines run in file-name order and append: numpy < 2 comes before this environment's.
    (site / "00-stub-numpy.pth").write_text(f"{numpy1}\n")
    env_sites = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "10-environment.pth").write_text("".join(f"import site; site.addsitedir({str(d)!r})\n" for d in env_sites))
    return root / "bin"


def _numpy_release(directory: Path) -> Version | None:
    """The numpy release installed in `directory` (from its dist-info), None if there is none."""
    for info in sorted(directory.glob("numpy-*.dist-info")) if directory.is_dir() else ():
        try:
            return Version(info.name[len("numpy-"):-len(".dist-info")])
        except InvalidVersion:
            continue
    return None


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
        lines = [l for l in lines if "NVML" not in l and "DCGM" not in l]
        errors = [l for l in lines if l.startswith("E") or "error" in l.lower()]
        keep = errors[-3:] or lines[-3:]
        return " | ".join(l.strip()[:300] for l in keep)

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


TRITONSERVER = "/opt/tritonserver/bin/tritonserver"  # where NVIDIA's Triton images install it


def server_command(repository: Path, endpoints: Endpoints) -> list[str]:
    """tritonserver over `repository` bound to `endpoints`, auto-complete off (deploy writes every
    config field), inside NVIDIA's Triton + TensorRT-LLM container."""
    e = endpoints
    return [
        TRITONSERVER,
        f"--model-repository={repository}",
        f"--http-address={e.host}",
        f"--grpc-address={e.host}",
        f"--http-port={e.http_port}",
        f"--grpc-port={e.grpc_port}",
        f"--metrics-port={e.metrics_port}",
        "--disable-auto-complete-config",
    ]


def leader_ranks_command(server: list[str], world_size: int, model_name: str, oversubscribe: bool = False) -> list[str]:
    """The engine backend's launch: one tritonserver per rank under one mpirun on one node (an MPMD
    world), each with its own Python-backend shared-memory prefix, ranks above 0 loading only the
    model: the leader-mode form of triton_backend/scripts/launch_triton_server.py (`get_cmd`, read
    on the main line, commit 0a2e2c1f). Every rank's model opens the target Executor in leader
    mode (runtime/trt_runners.py parallel_config); rank 0 serves, the others run the target's shard
    and never finish loading, so they never bind the ports (docs/engine-tp.md: why leader mode,
    not orchestrator mode). Every rank runs under explicit model control: rank 0 loads every model
    and can mark its own unavailable when a rank dies (triton_model.mark_unavailable).
    `oversubscribe`: inside a one-task Slurm step mpirun sees one slot (that script's
    `--oversubscribe`, "mainly for SLURM MPI")."""

    def rank(i: int) -> list[str]:
        own = "--load-model=*" if i == 0 else f"--load-model={model_name}"
        return [*server, f"--backend-config=python,shm-region-prefix-name=prefix{i}_", "--model-control-mode=explicit",
                own]

    if world_size == 1:
        return rank(0)
    cmd = ["mpirun", "--allow-run-as-root", *(["--oversubscribe"] if oversubscribe else [])]
    for i in range(world_size):
        cmd += ["-n", "1", *rank(i)] + ([":"] if i < world_size - 1 else [])
    return cmd


def launch_command(repository: Path, endpoints: Endpoints, world_size: int, model_name: str, llmapi: bool,
                   launcher: str = "single_node") -> list[str]:
    """The launch command of tritonserver on one node inside NVIDIA's Triton + TensorRT-LLM container.

    Engine backend (our Triton model over TensorRT-LLM 1.2.x engines): `leader_ranks_command`,
    whatever the launcher.

    pytorch backend (TensorRT-LLM's LLM-API model): "single_node" runs a single tritonserver; its
    model creates LLM(...) with model.yaml's tensor_parallel_size, which spawns the MPI workers
    itself (the documented multi-GPU setup of triton_backend/all_models/llmapi). "mpirun" starts
    an MPI world of tp x pp ranks, every rank under trtllm-llmapi-launch: rank 0 runs
    tritonserver, the others run tensorrt_llm.llmapi.mgmn_worker_node
    (tensorrt_llm/llmapi/trtllm-llmapi-launch), and model.py hands COMM_WORLD to the LLM.
    Across nodes, launch/cluster.py writes the Slurm and Kubernetes launchers around the same
    server command.
    """
    server = server_command(repository, endpoints)
    if not llmapi:
        return leader_ranks_command(server, world_size, model_name)
    if launcher == "mpirun":
        return mpi_world(world_size, ["trtllm-llmapi-launch", *server])
    return server


def mpi_world(world_size: int, rank: list[str]) -> list[str]:
    """`rank` as every process of a world_size MPI world on this node."""
    return ["mpirun", "--allow-run-as-root", "-n", str(world_size), *rank]


def served_paths(deploy_dir: Path) -> list[Path]:
    """Every directory a deployment opens, resolved, as its own files name them: the deploy
    output, the stage output it serves (its manifest's input: the build on the engine backend)
    and each directory its dflash model's settings name (deploy/settings.py PATHS: the engines and
    the checkpoint beside them, whose tokenizer and manifest the model opens). Paths inside are
    relative to each other, so a container mounts each where it is and they still meet."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from trtllm_dflash.artifacts import Manifest
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.deploy.settings import ModelSettings

    deploy_dir = Path(deploy_dir).resolve()
    m = Manifest.read(deploy_dir)
    paths = [deploy_dir] + ([m.input_dir(deploy_dir)] if m.input else [])
    config = deploy_dir / REPOSITORY / str(m.extra.get("model_name", "")) / "config.pbtxt"
    if config.is_file():
        cfg = text_format.Parse(config.read_text(), mc.ModelConfig())
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        settings = ModelSettings.from_params(params, str(config)).resolved(deploy_dir)
        paths += [Path(v) for k in PATHS if (v := getattr(settings, k))]
    return list(dict.fromkeys(paths))


def install_command(source: Path) -> list[str]:
    """Install this trtllm_dflash source checkout into NVIDIA's image, where the engine backend's
    Triton model imports it. Offline by construction: --no-index (pip reads no package index),
    --no-deps (the image's torch, transformers and the rest satisfy the requirements without
    moving its pins: docs/compat.md), --no-build-isolation (the image's setuptools builds it, none
    is fetched). Editable: pip writes only the checkout's egg-info, so the checkout is mounted
    read-write."""
    return ["python3", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation", "-e",
            str(source)]


def installed_first(cmd: list[str], source: Path | None) -> list[str]:
    """`cmd`, after installing `source` (install_command) when one is given."""
    if source is None:
        return cmd
    return ["bash", "-c", f"{shlex.join(install_command(source))} && exec {shlex.join(cmd)}"]


def in_container(cmd: list[str], image: str, paths: list[Path], source: Path | None = None) -> list[str]:
    """`cmd` inside the container `image` (NVIDIA's TensorRT-LLM or Triton + TensorRT-LLM image,
    the user's choice of tag): all GPUs, host IPC (NCCL, MPI shared memory), the host's network
    (the server binds the address it was given, loopback included), the paths the command reads
    mounted at the same place and, given a `source` checkout, that checkout installed first
    (install_command: the engine backend's model imports trtllm_dflash, NVIDIA's image lacks it)."""
    run = ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "--network", "host", "--ulimit", "memlock=-1",
           "--ulimit", "stack=67108864"]
    for path in dict.fromkeys(str(Path(p).resolve()) for p in [*paths, *([source] if source else [])]):
        run += ["-v", f"{path}:{path}"]
    return [*run, image, *installed_first(cmd, source)]
