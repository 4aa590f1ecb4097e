"""Read source checkpoints lazily and write safetensors files one tensor at a time.

`Checkpoint` maps every tensor name of an HF / z-lab directory (single file or sharded with
`model.safetensors.index.json`) to its file, shape and dtype from the headers alone, and reads
only the rows or columns a rank needs (`safe_open(...).get_slice`).

`StreamWriter` writes a safetensors file whose header is planned up front (names, shapes,
dtypes) and whose tensors then arrive one by one, so converting a checkpoint never holds more
than one tensor in memory. The safetensors Python API only saves whole dicts, hence this small
writer of the documented format: an 8-byte little-endian header length, a JSON header
(`dtype`, `shape`, `data_offsets` per tensor, padded with spaces to 8 bytes), then the raw
little-endian bytes in header order. Files are read back with `safetensors.safe_open`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from trtllm_dflash.errors import UserError

DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors code, e.g. "BF16"


class Checkpoint:
    """Lazy view of the safetensors files of one model directory."""

    def __init__(self, directory: Path, who: str):
        self.directory, self.who = Path(directory), who
        self.tensors: dict[str, TensorInfo] = {}
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise UserError(f"{who} {index}: unreadable index ({e})") from None
            files = sorted({self.directory / f for f in weight_map.values()})
        else:
            files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise UserError(f"{who} {self.directory}: no *.safetensors files (only safetensors checkpoints are "
                            "supported)")
        for path in files:
            if not path.is_file():
                raise UserError(f"{who} {path}: listed in model.safetensors.index.json but missing")
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    s = f.get_slice(name)
                    self.tensors[name] = TensorInfo(path, tuple(s.get_shape()), s.get_dtype())
        self._open: dict[Path, object] = {}

    @property
    def files(self) -> list[Path]:
        return sorted({t.file for t in self.tensors.values()})

    def read(self, name: str, dim: int | None = None, start: int = 0, stop: int = 0) -> torch.Tensor:
        """The whole tensor, or rows (dim 0) / columns (dim 1) [start, stop)."""
        info = self.tensors[name]
        f = self._open.get(info.file)
        if f is None:
            f = self._open[info.file] = safe_open(info.file, framework="pt").__enter__()
        if dim is None:
            return f.get_tensor(name)
        s = f.get_slice(name)
        if dim == 0:
            return s[start:stop]
        if dim == 1:
            return s[:, start:stop]
        raise ValueError(f"slicing along dim {dim} is not supported")

    def close(self) -> None:
        for f in self._open.values():
            f.__exit__(None, None, None)
        self._open.clear()


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * torch.empty((), dtype=dtype).element_size()


class StreamWriter:
    """Write one safetensors file from a planned list of (name, shape, dtype)."""

    def __init__(self, path: Path, specs: list[tuple[str, tuple[int, ...], torch.dtype]],
                 metadata: dict[str, str] | None = None):
        self.path = Path(path)
        header: dict = {"__metadata__": metadata or {"format": "pt"}}
        self.order: list[str] = []
        self.specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        offset = 0
        for name, shape, dtype in specs:
            if name in self.specs:
                raise ValueError(f"{path.name}: tensor {name} planned twice")
            n = _nbytes(shape, dtype)
            header[name] = {"dtype": DTYPE_CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
            self.specs[name] = (tuple(shape), dtype)
            self.order.append(name)
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._f = open(self.path, "wb")
        self._f.write(struct.pack("<Q", len(raw)))
        self._f.write(raw)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Tensors must arrive in the planned order, with the planned shape and dtype."""
        expected = self.order[self._next] if self._next < len(self.order) else None
        if name != expected:
            raise ValueError(f"{self.path.name}: got tensor {name}, expected {expected}")
        shape, dtype = self.specs[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"{self.path.name}: {name} is {tensor.dtype} {list(tensor.shape)}, planned {dtype} "
                             f"{list(shape)}")
        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        self._f.write(data.numpy().tobytes())
        self._next += 1

    def close(self) -> None:
        if self._next != len(self.order):
            self._f.close()
            raise ValueError(f"{self.path.name}: {len(self.order) - self._next} planned tensors were never written")
        self._f.close()

    def abort(self) -> None:
        self._f.close()
        self.path.unlink(missing_ok=True)
