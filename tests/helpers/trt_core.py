"""Stand-in for the C++ side of TensorRT 10.14's Python bindings: exactly the classes that the
pure-Python `tensorrt.plugin` package (loaded for real by trt_plugin_layer.py) and our
trt_plugin.py touch while a network with AOT plugins is built.

Read from NVIDIA/TensorRT branch release/10.14 (commit 3b4ddc1d, "TensorRT Release 10.14"):
- python/src/infer/pyPlugin.cpp: the bindings of IDimensionExpr, DimsExprs, IExprBuilder,
  PluginTensorDesc, DynamicPluginTensorDesc, PluginField(Collection), IPluginV3 and its Quick
  capability interfaces, IPluginCreatorV3Quick, IPluginRegistry / get_plugin_registry,
  ISymExpr(s), IKernelLaunchParams and the enums; how PluginField.data reinterprets its buffer;
- python/src/infer/pyGraph.cpp: the three `INetworkDefinition.add_plugin` overloads;
- python/src/infer/pyFoundationalTypes.cpp: DataType members and aliases, Dims;
- include/NvInferRuntime.h (IDimensionExpr, IExprBuilder, DimensionOperation),
  include/NvInferRuntimeBase.h (DataType values), include/impl/NvInferPythonPlugin.h
  (PluginArgType, PluginArgDataType, ISymExpr(s), IKernelLaunchParams,
  QuickPluginCreationRequest, IPluginV3Quick*).

Semantics kept where they matter: an IDimensionExpr is a build-time constant or a symbolic
expression over the network's dynamic dimensions (`get_constant_value()` of a symbolic one is
INT64_MIN, as in NvInferRuntime.h); the expression builder folds constant operands; a null
expression (Python None) cannot go where TensorRT dereferences one. `IDimensionExpr.evaluate`
is ours (TensorRT resolves expressions at enqueue time): tests use it to check expressions
against concrete shapes. Deliberately absent: everything the AOT path never reaches (the JIT
runtime, IPluginV2*, `trt.nptype`, TensorFormats other than LINEAR, size tensors).
"""

from __future__ import annotations

import enum
from typing import Iterable, Optional

import numpy as np

INT64_MIN = -(2 ** 63)


class _Enum(enum.Enum):
    """A pybind11 enum: members have .name and .value and compare by identity."""

    def __int__(self):
        return self.value


DataType = _Enum("DataType", [("FLOAT", 0), ("HALF", 1), ("INT8", 2), ("INT32", 3), ("BOOL", 4), ("UINT8", 5),
                              ("FP8", 6), ("BF16", 7), ("INT64", 8), ("INT4", 9), ("FP4", 10), ("E8M0", 11)])
DataType.__doc__ = "nvinfer1::DataType (NvInferRuntimeBase.h), bound as tensorrt.DataType."
# Module-level aliases of pyFoundationalTypes.cpp (trt.float32, trt.bool, ...); kept in a dict so
# that `bool` is not shadowed here.
ALIASES = {"float32": DataType.FLOAT, "float16": DataType.HALF, "bfloat16": DataType.BF16, "int8": DataType.INT8,
           "int32": DataType.INT32, "int64": DataType.INT64, "bool": DataType.BOOL, "uint8": DataType.UINT8,
           "fp8": DataType.FP8, "int4": DataType.INT4, "fp4": DataType.FP4, "e8m0": DataType.E8M0}
TensorFormat = _Enum("TensorFormat", [("LINEAR", 0)])
TensorFormat.__doc__ = "nvinfer1::TensorFormat (NvInferRuntime.h); only kLINEAR, the plugin layer's default format."
DimensionOperation = _Enum("DimensionOperation", [("SUM", 0), ("PROD", 1), ("MAX", 2), ("MIN", 3), ("SUB", 4),
                                                  ("EQUAL", 5), ("LESS", 6), ("FLOOR_DIV", 7), ("CEIL_DIV", 8)])
DimensionOperation.__doc__ = "nvinfer1::DimensionOperation (NvInferRuntime.h)."
PluginFieldType = _Enum("PluginFieldType", [("FLOAT16", 0), ("FLOAT32", 1), ("FLOAT64", 2), ("INT8", 3),
                                            ("INT16", 4), ("INT32", 5), ("CHAR", 6), ("DIMS", 7), ("UNKNOWN", 8),
                                            ("BF16", 9), ("INT64", 10), ("FP8", 11), ("INT4", 12), ("FP4", 13)])
PluginFieldType.__doc__ = "nvinfer1::PluginFieldType (NvInferRuntimePlugin.h)."
TensorRTPhase = _Enum("TensorRTPhase", [("BUILD", 0), ("RUNTIME", 1)])
PluginCapabilityType = _Enum("PluginCapabilityType", [("CORE", 0), ("BUILD", 1), ("RUNTIME", 2)])
QuickPluginCreationRequest = _Enum("QuickPluginCreationRequest", [("UNKNOWN", 0), ("PREFER_JIT", 1),
                                                                  ("PREFER_AOT", 2), ("STRICT_JIT", 3),
                                                                  ("STRICT_AOT", 4)])
PluginArgType = _Enum("PluginArgType", [("INT", 0)])
PluginArgDataType = _Enum("PluginArgDataType", [("INT8", 0), ("INT16", 1), ("INT32", 2)])

# PluginField.data: the numpy dtype pyPlugin.cpp reads the buffer as, per field type (kUNKNOWN as int8).
_FIELD_NUMPY = {"INT32": np.int32, "UNKNOWN": np.int8, "INT8": np.int8, "INT16": np.int16, "FLOAT32": np.float32,
                "FLOAT64": np.float64, "INT64": np.int64, "CHAR": np.int8}


class Logger:
    """tensorrt.Logger (ILogger): records messages instead of printing them."""

    Severity = _Enum("Severity", [("INTERNAL_ERROR", 0), ("ERROR", 1), ("WARNING", 2), ("INFO", 3), ("VERBOSE", 4)])
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity

    def __init__(self, min_severity=None):
        self.messages = []

    def log(self, severity, msg):
        self.messages.append((severity, msg))


class Dims(tuple):
    """nvinfer1::Dims as bound in pyFoundationalTypes.cpp: built from a list or tuple (not from an
    int), compares equal to tuples, MAX_DIMS = 8 (NvInferRuntimeBase.h)."""

    MAX_DIMS = 8

    def __new__(cls, shape: Iterable[int] = ()):
        dims = tuple(int(d) for d in shape)
        if len(dims) > cls.MAX_DIMS:
            raise ValueError(f"Input length {len(dims)}. Max expected length is {cls.MAX_DIMS}")
        return super().__new__(cls, dims)


class IDimensionExpr:
    """nvinfer1::IDimensionExpr (NvInferRuntime.h): a build-time constant, an input dimension
    that is only known at run time (a symbol), or an operation on two expressions. Bound methods:
    is_constant(), get_constant_value() (INT64_MIN unless constant), is_size_tensor()."""

    def __init__(self, kind: str, value=None, args=()):
        self._kind, self._value, self._args = kind, value, args  # kind: "const", "sym" or a DimensionOperation name

    def is_constant(self) -> bool:
        return self._kind == "const"

    def get_constant_value(self) -> int:
        return self._value if self._kind == "const" else INT64_MIN

    def is_size_tensor(self) -> bool:
        return False

    def evaluate(self, env: dict) -> int:
        """Not a TensorRT method: the value for concrete dimensions `env` (symbol name -> int)."""
        if self._kind == "const":
            return self._value
        if self._kind == "sym":
            if self._value not in env:
                raise KeyError(f"no value for the dynamic dimension {self._value}")
            return env[self._value]
        return _apply(self._kind, self._args[0].evaluate(env), self._args[1].evaluate(env))

    def __repr__(self):
        if self._kind in ("const", "sym"):
            return str(self._value)
        return f"{self._kind}({self._args[0]!r}, {self._args[1]!r})"


def _apply(op: str, a: int, b: int) -> int:
    """DimensionOperation semantics (NvInferRuntime.h): FLOOR_DIV / CEIL_DIV round down / up."""
    if op in ("FLOOR_DIV", "CEIL_DIV") and b == 0:
        raise ZeroDivisionError(f"{op} by zero in a dimension expression")
    return {"SUM": lambda: a + b, "PROD": lambda: a * b, "MAX": lambda: max(a, b), "MIN": lambda: min(a, b),
            "SUB": lambda: a - b, "EQUAL": lambda: int(a == b), "LESS": lambda: int(a < b),
            "FLOOR_DIV": lambda: a // b, "CEIL_DIV": lambda: -(-a // b)}[op]()


def symbol(name: str) -> IDimensionExpr:
    """A dynamic (run-time) dimension; what TensorRT hands a plugin for a -1 network dimension."""
    return IDimensionExpr("sym", name)


class IExprBuilder:
    """nvinfer1::IExprBuilder (NvInferRuntime.h): constant(value), operation(op, first, second);
    operations on two constants fold to a constant, as TensorRT's do."""

    def constant(self, value: int) -> IDimensionExpr:
        return IDimensionExpr("const", int(value))

    def operation(self, op, first: IDimensionExpr, second: IDimensionExpr) -> IDimensionExpr:
        for name, expr in (("first", first), ("second", second)):
            if not isinstance(expr, IDimensionExpr):
                raise TypeError(f"IExprBuilder.operation: {name} must be an IDimensionExpr, got {type(expr).__name__}")
        if first.is_constant() and second.is_constant():
            return self.constant(_apply(op.name, first.get_constant_value(), second.get_constant_value()))
        return IDimensionExpr(op.name, args=(first, second))


class DimsExprs:
    """nvinfer1::DimsExprs as bound in pyPlugin.cpp: DimsExprs(n) or DimsExprs(list); len / get /
    set. A None item would be a null IDimensionExpr that TensorRT dereferences: refused here."""

    def __init__(self, arg=0):
        items = [None] * arg if isinstance(arg, int) else list(arg)
        if len(items) > Dims.MAX_DIMS:
            raise ValueError(f"Input length {len(items)}. Max expected length is {Dims.MAX_DIMS}")
        self._items = items

    def __len__(self):
        return len(self._items)

    def __getitem__(self, index: int) -> IDimensionExpr:
        return self._items[index]

    def __setitem__(self, index: int, item: IDimensionExpr):
        if not isinstance(item, IDimensionExpr):
            raise TypeError(f"DimsExprs[{index}] must be an IDimensionExpr, got {item!r} (TensorRT would read a "
                            "null expression)")
        self._items[index] = item


class PluginTensorDesc:
    """nvinfer1::PluginTensorDesc (NvInferRuntimePlugin.h): dims, type, format, scale."""

    def __init__(self):
        self.dims, self.type, self.format, self.scale = Dims(), DataType.FLOAT, TensorFormat.LINEAR, 0.0


class DynamicPluginTensorDesc:
    """nvinfer1::DynamicPluginTensorDesc (NvInferRuntime.h): desc (dims as at network creation,
    -1 for dynamic ones) and the profile's min / opt / max dims."""

    def __init__(self):
        self.desc, self.min, self.opt, self.max = PluginTensorDesc(), Dims(), Dims(), Dims()


class PluginField:
    """nvinfer1::PluginField as bound in pyPlugin.cpp: keeps the buffer and its element count;
    `data` reads it back as the numpy dtype of `type` (kINT8 / kUNKNOWN as int8)."""

    def __init__(self, name: str = "", data=None, type=PluginFieldType.UNKNOWN):
        self.name, self.type = name, type
        buffer = memoryview(b"" if data is None else data)
        self._bytes, self.size = buffer.tobytes(), buffer.nbytes // max(buffer.itemsize, 1)

    @property
    def data(self) -> np.ndarray:
        if self.type.name not in _FIELD_NUMPY:
            raise AttributeError("No known conversion for returning data from PluginField")
        dtype = np.dtype(_FIELD_NUMPY[self.type.name])
        if len(self._bytes) < self.size * dtype.itemsize:
            raise ValueError(f"PluginField {self.name!r}: {self.size} {dtype} entries need "
                             f"{self.size * dtype.itemsize} bytes, the buffer has {len(self._bytes)}")
        return np.frombuffer(self._bytes, dtype=dtype, count=self.size).copy()


class PluginFieldCollection(list):
    """tensorrt.PluginFieldCollection (pyTensorRT.cpp: py::bind_vector<std::vector<PluginField>>)."""


class ISymExpr:
    """nvinfer1::ISymExpr (NvInferPythonPlugin.h): `type`, `dtype` and `expr` are write-only from
    Python; TensorRT reads them through getType() / getDataType() / getExpr() (here: .read())."""

    def __init__(self):
        self._fields = {}

    def __setattr__(self, name, value):
        if name in ("type", "dtype", "expr"):
            self._fields[name] = value
        else:
            super().__setattr__(name, value)

    def __getattr__(self, name):
        if name in ("type", "dtype", "expr"):
            raise AttributeError(f"unreadable attribute '{name}'")
        raise AttributeError(name)

    def read(self):
        """TensorRT's side: (PluginArgType, PluginArgDataType, IDimensionExpr or None)."""
        return self._fields.get("type"), self._fields.get("dtype"), self._fields.get("expr")


class ISymExprs:
    """nvinfer1::ISymExprs (NvInferPythonPlugin.h): `nbSymExprs`, len, get, set (set out of range
    returns False, like setSymExpr)."""

    def __init__(self):
        self._items = []

    @property
    def nbSymExprs(self) -> int:
        return len(self._items)

    @nbSymExprs.setter
    def nbSymExprs(self, count: int):
        self._items = (self._items + [None] * count)[:count]

    def __len__(self):
        return len(self._items)

    def __getitem__(self, index: int) -> Optional[ISymExpr]:
        return self._items[index] if 0 <= index < len(self._items) else None

    def __setitem__(self, index: int, expr: ISymExpr) -> bool:
        if not 0 <= index < len(self._items):
            return False
        self._items[index] = expr
        return True


class IKernelLaunchParams:
    """nvinfer1::IKernelLaunchParams (NvInferPythonPlugin.h): grid_x/y/z, block_x/y/z, shared_mem
    as ISymExpr."""

    def __init__(self):
        self.grid_x = self.grid_y = self.grid_z = None
        self.block_x = self.block_y = self.block_z = self.shared_mem = None


class IVersionedInterface:
    """nvinfer1::IVersionedInterface (NvInferPluginBase.h)."""


class IPluginCapability(IVersionedInterface):
    """nvinfer1::IPluginCapability (NvInferPluginBase.h)."""


class IPluginV3(IVersionedInterface):
    """nvinfer1::IPluginV3 (NvInferRuntime.h); Python plugins derive from the binding class."""


class IPluginV3QuickCore(IPluginCapability):
    """nvinfer1::v_1_0::IPluginV3QuickCore (NvInferPythonPlugin.h): plugin_name / _version / _namespace."""


class IPluginV3QuickBuild(IPluginCapability):
    """nvinfer1::v_1_0::IPluginV3QuickBuild (NvInferPythonPlugin.h): output types and shapes,
    format combinations, configure, tactics (implemented in Python by tensorrt.plugin)."""


class IPluginV3QuickAOTBuild(IPluginV3QuickBuild):
    """nvinfer1::v_1_0::IPluginV3QuickAOTBuild (NvInferPythonPlugin.h): adds getLaunchParams,
    getKernel and setTactic."""


class IPluginV3QuickRuntime(IPluginCapability):
    """nvinfer1::v_1_0::IPluginV3QuickRuntime (NvInferPythonPlugin.h): JIT enqueue (never reached here)."""


class IPluginCreatorV3Quick:
    """nvinfer1::v_1_0::IPluginCreatorV3Quick (NvInferPythonPlugin.h): name, plugin_version,
    plugin_namespace, field_names; create_plugin(name, namespace, fc, phase, request) in Python."""


class IPluginRegistry:
    """nvinfer1::IPluginRegistry: register_creator(creator, namespace) -> False for a duplicate
    (name, version, namespace); get_creator(type, version, namespace) -> creator or None."""

    def __init__(self):
        self._creators = {}

    def register_creator(self, creator, plugin_namespace: str = "") -> bool:
        key = (creator.name, creator.plugin_version, plugin_namespace)
        if key in self._creators:
            return False
        self._creators[key] = creator
        return True

    def get_creator(self, type: str, version: str, plugin_namespace: str = ""):
        return self._creators.get((type, version, plugin_namespace))


class PluginRegistryFactory:
    """`tensorrt.get_plugin_registry()`: one registry per loaded `tensorrt` module (pyPlugin.cpp
    caches it in the module attribute _plugin_registry)."""

    def __init__(self):
        self._registry = IPluginRegistry()

    def __call__(self) -> IPluginRegistry:
        return self._registry


class Weights:
    """nvinfer1::Weights built from a numpy array (tensorrt.Weights(array)); keeps the array, as
    TensorRT keeps the pointer."""

    _TYPES = {np.dtype(np.float32): DataType.FLOAT, np.dtype(np.float16): DataType.HALF,
              np.dtype(np.int32): DataType.INT32}

    def __init__(self, array: np.ndarray):
        if np.dtype(array.dtype) not in self._TYPES:
            raise TypeError(f"Weights: unsupported numpy dtype {array.dtype}")
        self.array, self.dtype = array, self._TYPES[np.dtype(array.dtype)]


class ITensor:
    """nvinfer1::ITensor: name, dtype, shape (-1 for a dimension unknown at network creation).
    `_exprs` holds the dimension expressions behind `shape` (TensorRT's internal shape graph)."""

    def __init__(self, name: str, dtype, exprs: list):
        self.name, self.dtype, self._exprs = name, dtype, list(exprs)

    @property
    def shape(self) -> Dims:
        return Dims(e.get_constant_value() if e.is_constant() else -1 for e in self._exprs)


class ILayer:
    """nvinfer1::ILayer (IConstantLayer / IPluginV3Layer): get_output(i), num_outputs; `plugin`
    for a plugin layer (IPluginV3Layer.get_plugin())."""

    def __init__(self, kind: str, inputs: list, outputs: list, plugin=None):
        self.kind, self.inputs, self._outputs, self.plugin = kind, inputs, outputs, plugin

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    def get_plugin(self):
        return self.plugin


class PluginCallbackError(RuntimeError):
    """A plugin method raised while TensorRT called it. TensorRT's trampolines (pyPlugin.cpp) print
    "[ERROR] Exception thrown from <method>()" and fail the layer; here the build stops with the
    original exception as __cause__."""

    def __init__(self, method: str, error: BaseException):
        super().__init__(f"{method}() raised {type(error).__name__}: {error}")
        self.method, self.error = method, error


def call_plugin(method: str, fn, *args):
    """Call a Python plugin method as TensorRT's trampoline does (errors: PluginCallbackError)."""
    try:
        return fn(*args)
    except Exception as error:  # noqa: BLE001 - any exception fails the layer in TensorRT
        raise PluginCallbackError(method, error) from error


def _check_plugin(plugin) -> None:
    if not isinstance(plugin, IPluginV3):
        raise TypeError(f"add_plugin: create_plugin returned {type(plugin).__name__}, not an IPluginV3")


class INetworkDefinition:
    """nvinfer1::INetworkDefinition, the calls our insert helpers make: add_input, add_constant,
    mark_output and the three add_plugin overloads of pyGraph.cpp: add_plugin(tuple),
    add_plugin(func) (request from the network's PREFER_*_PYTHON_PLUGINS flags; none here, so
    UNKNOWN) and add_plugin(func, aot) (STRICT_AOT / STRICT_JIT).

    Adding a plugin layer queries it as TensorRT does to give the new outputs a type and a shape:
    get_capability_interface(BUILD), get_num_outputs, get_output_data_types(input types, ranks)
    and get_output_shapes(input expressions, [], builder)."""

    def __init__(self):
        self.layers, self.inputs, self.outputs = [], [], []

    def add_input(self, name: str, dtype, shape) -> ITensor:
        builder = IExprBuilder()
        exprs = [symbol(f"{name}.{axis}") if d < 0 else builder.constant(d) for axis, d in enumerate(shape)]
        tensor = ITensor(name, dtype, exprs)
        self.inputs.append(tensor)
        return tensor

    def add_constant(self, shape, weights: Weights) -> ILayer:
        builder = IExprBuilder()
        out = ITensor(f"constant_{len(self.layers)}", weights.dtype, [builder.constant(d) for d in shape])
        layer = ILayer("constant", [], [out])
        self.layers.append(layer)
        return layer

    def mark_output(self, tensor: ITensor) -> None:
        self.outputs.append(tensor)

    def add_plugin(self, func, aot=None) -> ILayer:
        if isinstance(func, tuple):
            return self._add_plugin_v3(*func)
        request = QuickPluginCreationRequest.UNKNOWN if aot is None else (
            QuickPluginCreationRequest.STRICT_AOT if aot else QuickPluginCreationRequest.STRICT_JIT)
        return self._add_plugin_v3(*func(request))

    def _add_plugin_v3(self, inputs: list, shape_inputs: list, plugin) -> ILayer:
        _check_plugin(plugin)
        for t in inputs:
            if not isinstance(t, ITensor):
                raise TypeError(f"add_plugin: input {t!r} is not an ITensor")
        build = call_plugin("get_capability_interface", plugin.get_capability_interface, PluginCapabilityType.BUILD)
        n = call_plugin("get_num_outputs", build.get_num_outputs)
        types = output_types(build, inputs, n)
        shapes = output_shapes(build, inputs, n)
        name = len(self.layers)
        outputs = [ITensor(f"plugin_{name}_out{i}", types[i], list(shapes[i])) for i in range(n)]
        layer = ILayer("plugin", list(inputs), outputs, plugin)
        self.layers.append(layer)
        return layer


def output_types(build, inputs: list, n: int) -> list:
    """IPluginV3QuickBuild::getOutputDataTypes with the inputs' types and ranks; the trampoline
    requires exactly n DataTypes."""
    types = call_plugin("get_output_data_types", build.get_output_data_types, [t.dtype for t in inputs],
                        [len(t._exprs) for t in inputs])
    types = list(types)
    if len(types) != n or not all(isinstance(t, DataType) for t in types):
        raise PluginCallbackError("get_output_data_types", RuntimeError(
            f"returned {types!r}; TensorRT needs {n} DataTypes (num_outputs)"))
    return types


def output_shapes(build, inputs: list, n: int) -> list:
    """IPluginV3QuickBuild::getOutputShapes with the inputs' dimension expressions; n DimsExprs."""
    shapes = call_plugin("get_output_shapes", build.get_output_shapes, [DimsExprs(t._exprs) for t in inputs], [],
                         IExprBuilder())
    shapes = list(shapes)
    if len(shapes) != n or not all(isinstance(s, DimsExprs) for s in shapes):
        raise PluginCallbackError("get_output_shapes", RuntimeError(
            f"returned {shapes!r}; TensorRT needs {n} DimsExprs (num_outputs)"))
    for i, s in enumerate(shapes):
        if any(e is None for e in s):
            raise PluginCallbackError("get_output_shapes", RuntimeError(f"output {i} has an unset dimension"))
    return shapes


__all__ = [
    "DataType", "TensorFormat", "DimensionOperation", "PluginFieldType", "TensorRTPhase", "PluginCapabilityType",
    "QuickPluginCreationRequest", "PluginArgType", "PluginArgDataType", "Logger", "Dims", "IDimensionExpr",
    "IExprBuilder", "DimsExprs", "PluginTensorDesc", "DynamicPluginTensorDesc", "PluginField",
    "PluginFieldCollection", "ISymExpr", "ISymExprs", "IKernelLaunchParams", "IVersionedInterface",
    "IPluginCapability", "IPluginV3", "IPluginV3QuickCore", "IPluginV3QuickBuild", "IPluginV3QuickAOTBuild",
    "IPluginV3QuickRuntime", "IPluginCreatorV3Quick", "IPluginRegistry", "Weights", "ITensor", "ILayer",
    "INetworkDefinition",
]
