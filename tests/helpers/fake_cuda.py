"""Stand-ins as strict as the real thing about *which GPU*: CUDA devices with a current device,
and the TensorRT / TensorRT-LLM objects a drafter engine's runner creates, each recording the
device that was current when it was made (the real ones bind to it).

Mirrors:
- torch.cuda (torch 2.9-2.13): set_device / current_device / `device` context manager /
  Stream(device) / current_stream(device); a Stream lives on the device it was given, or the
  current one.
- tensorrt 10.14 (python/bindings): Runtime.deserialize_cuda_engine binds the engine to the
  current device; ICudaEngine.create_execution_context allocates its activation memory there;
  IExecutionContext.execute_async_v3(stream) must run on the engine's device with a stream of it.
- tensorrt_llm 1.2.x: tensorrt_llm/plugin/plugin.py CustomAllReduceHelper.allocate_workspace
  (IpcMemory's cudaMalloc on the current device, tensorrt_llm/_ipc_utils.py) and
  max_workspace_size_auto; tensorrt_llm/mapping.py Mapping(world_size, rank, tp_size).
- cuda-python's cudart (what tensorrt_llm/_ipc_utils.py set_peer_access calls):
  cudaDeviceCanAccessPeer(a, b) and cudaDeviceEnablePeerAccess(peer, 0), which enables access
  from the CURRENT device.
`install(monkeypatch, gpus)` puts them in place of torch.cuda's functions and of the modules.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from types import ModuleType, SimpleNamespace

import stand_in


class FakeCuda:
    """`gpus` CUDA devices and the current one (0 until set, as CUDA's)."""

    def __init__(self, gpus: int):
        self.gpus, self.current = gpus, 0
        self.events: list[tuple] = []  # (what, device) in order
        self.peer: set[tuple[int, int]] = set()  # (from, to) pairs enabled

    def _index(self, device) -> int:
        if device is None:
            return self.current
        index = getattr(device, "index", device)
        if isinstance(device, str):
            index = int(device.split(":")[1]) if ":" in device else self.current
        if index is None:
            return self.current
        if not 0 <= int(index) < self.gpus:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return int(index)

    def set_device(self, device) -> None:
        self.current = self._index(device)

    def current_device(self) -> int:
        return self.current

    @contextlib.contextmanager
    def device(self, device):
        before, self.current = self.current, self._index(device)
        try:
            yield
        finally:
            self.current = before

    def Stream(self, device=None):  # noqa: N802 (torch's name)
        stream = SimpleNamespace(device=SimpleNamespace(index=self._index(device)), cuda_stream=id(object()))
        stream.wait_stream = lambda other: self._same(stream, other)
        self.events.append(("stream", stream.device.index))
        return stream

    def current_stream(self, device=None):
        return self.Stream(device)

    def _same(self, a, b) -> None:
        if a.device.index != b.device.index:
            raise RuntimeError(f"a stream of cuda:{a.device.index} waits on one of cuda:{b.device.index}")

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.gpus


class _DataType(enum.Enum):
    FLOAT = 0
    BF16 = 1
    INT32 = 2


def tensorrt_module(cuda: FakeCuda, shapes: dict, dtypes: dict) -> ModuleType:
    """`tensorrt` with Logger, Runtime -> engine -> execution context, each bound to the device
    current at its creation."""
    trt = stand_in.module("tensorrt")

    class Logger:
        WARNING = 2

        def __init__(self, level=None):
            pass

    class Context:
        def __init__(self, engine):
            self.engine, self.device = engine, cuda.current
            cuda.events.append(("context", self.device))

        def set_input_shape(self, name, shape):
            return True

        def set_tensor_address(self, name, ptr):
            return True

        def execute_async_v3(self, stream_handle):
            cuda.events.append(("execute", cuda.current))
            if cuda.current != self.device:
                raise RuntimeError(f"execute_async_v3 on cuda:{cuda.current} of a context on cuda:{self.device}")
            return True

    class Engine:
        def __init__(self):
            self.device = cuda.current
            cuda.events.append(("engine", self.device))

        def create_execution_context(self):
            return Context(self)

        def get_tensor_shape(self, name):
            return shapes[name]

        def get_tensor_dtype(self, name):
            return _DataType[dtypes.get(name, "BF16")]

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, blob):
            return Engine()

    trt.Logger, trt.Runtime = Logger, Runtime
    return trt


def tensorrt_llm_modules(cuda: FakeCuda) -> dict[str, ModuleType]:
    """tensorrt_llm, tensorrt_llm.mapping (Mapping), tensorrt_llm.plugin.plugin
    (CustomAllReduceHelper) and cuda.cudart, recording where the workspace was allocated and
    which peer access was enabled from which device."""
    root, mapping, plugin_pkg, plugin = (stand_in.module(n) for n in (
        "tensorrt_llm", "tensorrt_llm.mapping", "tensorrt_llm.plugin", "tensorrt_llm.plugin.plugin"))

    class Mapping:
        def __init__(self, world_size=1, rank=0, tp_size=1, **_):
            self.world_size, self.rank, self.tp_size = world_size, rank, tp_size
            self.tp_group = list(range(tp_size))

    class CustomAllReduceHelper:
        @staticmethod
        def max_workspace_size_auto(tp, **_):
            return 1 << 20

        @staticmethod
        def allocate_workspace(mapping, size):
            cuda.events.append(("workspace", cuda.current))
            return [SimpleNamespace(device=cuda.current)], SimpleNamespace(device="cpu", shape=(1,), data_ptr=lambda: 0)

    mapping.Mapping, plugin.CustomAllReduceHelper = Mapping, CustomAllReduceHelper
    root.mapping, root.plugin, plugin_pkg.plugin = mapping, plugin_pkg, plugin

    cudart = stand_in.module("cuda.cudart")
    ok = SimpleNamespace(name="cudaSuccess")
    cudart.cudaError_t = SimpleNamespace(cudaSuccess=ok, cudaErrorPeerAccessAlreadyEnabled=object())
    cudart.cudaDeviceCanAccessPeer = lambda a, b: (ok, 1)

    def enable(peer, flags):
        cuda.events.append(("peer", cuda.current, peer))
        cuda.peer.add((cuda.current, peer))
        return (ok,)

    cudart.cudaDeviceEnablePeerAccess = enable
    cudart.cudaGetLastError = lambda: (ok,)
    cuda_pkg = stand_in.module("cuda")
    cuda_pkg.cudart = cudart
    return {"tensorrt_llm": root, "tensorrt_llm.mapping": mapping, "tensorrt_llm.plugin": plugin_pkg,
            "tensorrt_llm.plugin.plugin": plugin, "cuda": cuda_pkg, "cuda.cudart": cudart}


def install(monkeypatch, gpus: int, shapes: dict, dtypes: dict) -> FakeCuda:
    """Put a FakeCuda of `gpus` devices in place of torch.cuda's device functions and the fake
    tensorrt / tensorrt_llm / cuda.cudart modules in sys.modules."""
    import torch

    cuda = FakeCuda(gpus)
    for name in ("set_device", "current_device", "device", "Stream", "current_stream", "is_available", "device_count"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setitem(sys.modules, "tensorrt", tensorrt_module(cuda, shapes, dtypes))
    for name, module in tensorrt_llm_modules(cuda).items():
        monkeypatch.setitem(sys.modules, name, module)
    return cuda
