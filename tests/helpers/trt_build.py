"""TensorRT's engine builder, as far as it drives an AOT Python plugin layer (TensorRT 10.14).

libnvinfer's builder is closed source; the order below is the one its plugin interfaces
require and document (include/impl/NvInferPythonPlugin.h, include/NvInferRuntime.h
IPluginV3OneBuild, NVIDIA/TensorRT release/10.14), and the one the state kept by
tensorrt/plugin/_plugin_class.py::_TemplateAOTPlugin forces (each call reads what the one
before stored):

1. clone() the plugin of the network's layer;
2. get_capability_interface(BUILD), which must be an IPluginV3QuickAOTBuild for an AOT plugin;
3. get_output_data_types(input types, ranks): the dtype-inference pass, where the register
   function sees "fake" ShapeExprs (stores input_types);
4. get_output_shapes(input DimsExprs, [], builder): dynamic dims are symbolic expressions
   (stores input_descs / output_descs);
5. get_supported_format_combinations(in_out, nb_inputs), twice (the trampoline asks for the
   count, then the list); the first combination whose types match the network's is taken;
6. configure_plugin(in, out) with DynamicPluginTensorDesc: desc.dims as at network creation
   (-1 where dynamic), min/opt/max from the optimization profile (stores the combination);
7. get_valid_tactics(); none advertised means the default tactic 0 ("If no custom tactics were
   advertised, this will have a value of 0", NvInferRuntime.h); set_tactic(tactic);
8. get_launch_params(input DimsExprs, in_out, nb_inputs, IKernelLaunchParams, ISymExprs,
   builder): runs the plugin's aot_impl (stores the kernel per type/format/tactic);
9. get_kernel(input PluginTensorDescs, output PluginTensorDescs) -> (name, PTX bytes).

The profile here has min = opt = max = the shapes given for the network inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trt_core
from trt_core import (
    DimsExprs,
    DynamicPluginTensorDesc,
    IExprBuilder,
    IKernelLaunchParams,
    ISymExprs,
    PluginArgDataType,
    PluginArgType,
    PluginCallbackError,
    PluginCapabilityType,
    PluginTensorDesc,
    TensorFormat,
    call_plugin,
)

LAUNCH_FIELDS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_mem")


@dataclass
class PluginBuild:
    """What the builder took from one AOT plugin layer."""

    output_types: list
    output_shapes: list  # per output: list of IDimensionExpr
    kernel_name: str = ""
    ptx: bytes = b""
    launch: dict = field(default_factory=dict)  # LAUNCH_FIELDS -> IDimensionExpr
    extra_args: list = field(default_factory=list)  # IDimensionExpr, int32 each


def profile_env(network: trt_core.INetworkDefinition, shapes: dict) -> dict:
    """Symbol name -> value for the network inputs' dynamic dims, from concrete input shapes."""
    env = {}
    for tensor in network.inputs:
        shape = shapes[tensor.name]
        if len(shape) != len(tensor._exprs):
            raise ValueError(f"profile shape {shape} for {tensor.name} has the wrong rank")
        for expr, value in zip(tensor._exprs, shape):
            if expr.is_constant() and expr.get_constant_value() != value:
                raise ValueError(f"{tensor.name}: static dim {expr.get_constant_value()} != profile value {value}")
            if not expr.is_constant():
                env[expr._value] = value
    return env


def _dynamic_desc(dims, exprs, dtype, env: dict) -> DynamicPluginTensorDesc:
    desc = DynamicPluginTensorDesc()
    desc.desc.dims = trt_core.Dims(dims)
    desc.desc.type = dtype
    desc.desc.format = TensorFormat.LINEAR
    desc.desc.scale = 1.0
    desc.min = desc.opt = desc.max = trt_core.Dims(e.evaluate(env) for e in exprs)
    return desc


def _static_desc(dynamic: DynamicPluginTensorDesc) -> PluginTensorDesc:
    desc = PluginTensorDesc()
    desc.dims, desc.type, desc.format, desc.scale = dynamic.opt, dynamic.desc.type, dynamic.desc.format, 1.0
    return desc


def _choose_combination(build, in_out: list, nb_inputs: int) -> list:
    """The first supported combination whose types are the network's (it is strongly typed)."""
    for _ in range(2):  # getNbSupportedFormatCombinations, then getSupportedFormatCombinations
        combos = call_plugin("get_supported_format_combinations", build.get_supported_format_combinations,
                             in_out, nb_inputs)
    n = len(in_out)
    if len(combos) % n:
        raise PluginCallbackError("get_supported_format_combinations", ValueError(
            "Number of supported format combinations not a multiple of number of IO."))
    for start in range(0, len(combos), n):
        combo = combos[start:start + n]
        if [c.type for c in combo] == [d.desc.type for d in in_out]:
            return combo
    raise RuntimeError(f"no supported format combination has the network's types {[d.desc.type for d in in_out]}")


def _read_sym(name: str, sym) -> trt_core.IDimensionExpr:
    """An ISymExpr as TensorRT reads it: an int32 integer with a non-null expression."""
    if not isinstance(sym, trt_core.ISymExpr):
        raise RuntimeError(f"{name}: not set (TensorRT reads a null ISymExpr)")
    arg_type, dtype, expr = sym.read()
    if arg_type is not PluginArgType.INT or dtype is not PluginArgDataType.INT32:
        raise RuntimeError(f"{name}: {arg_type} {dtype}; expected an INT32 integer")
    if not isinstance(expr, trt_core.IDimensionExpr):
        raise RuntimeError(f"{name}: expression {expr!r} is not an IDimensionExpr (null in TensorRT)")
    return expr


def _aot_kernel(build, layer, in_out: list, record: PluginBuild) -> None:
    """Steps 8-9: launch parameters, extra arguments and the compiled kernel."""
    launch, extra = IKernelLaunchParams(), ISymExprs()
    inputs = [DimsExprs(t._exprs) for t in layer.inputs]
    call_plugin("get_launch_params", build.get_launch_params, inputs, in_out, len(layer.inputs), launch, extra,
                IExprBuilder())
    record.launch = {name: _read_sym(name, getattr(launch, name)) for name in LAUNCH_FIELDS}
    record.extra_args = [_read_sym(f"extra arg {i}", extra[i]) for i in range(len(extra))]
    n_in = len(layer.inputs)
    name, ptx = call_plugin("get_kernel", build.get_kernel, [_static_desc(d) for d in in_out[:n_in]],
                            [_static_desc(d) for d in in_out[n_in:]])
    if not isinstance(name, (str, bytes)) or not isinstance(ptx, bytes):
        raise PluginCallbackError("get_kernel", TypeError(
            f"returned ({type(name).__name__}, {type(ptx).__name__}); TensorRT casts to (std::string, bytes)"))
    record.kernel_name, record.ptx = name.decode() if isinstance(name, bytes) else name, ptx


def build_plugin_layer(layer, env: dict) -> PluginBuild:
    """Steps 1-9 for one plugin layer; `env` from profile_env."""
    plugin = call_plugin("clone", layer.plugin.clone)
    build = call_plugin("get_capability_interface", plugin.get_capability_interface, PluginCapabilityType.BUILD)
    if not isinstance(build, trt_core.IPluginV3QuickAOTBuild):
        raise RuntimeError(f"{type(build).__name__} is not an AOT plugin: no kernel to embed in the engine")
    n = call_plugin("get_num_outputs", build.get_num_outputs)
    types = trt_core.output_types(build, layer.inputs, n)
    shapes = trt_core.output_shapes(build, layer.inputs, n)
    record = PluginBuild(types, [list(s) for s in shapes])
    in_out = [_dynamic_desc(t.shape, t._exprs, t.dtype, env) for t in layer.inputs]
    in_out += [_dynamic_desc([e.get_constant_value() if e.is_constant() else -1 for e in s], s, dt, env)
               for s, dt in zip(record.output_shapes, types)]
    combo = _choose_combination(build, in_out, len(layer.inputs))
    for desc, chosen in zip(in_out, combo):
        desc.desc.type, desc.desc.format = chosen.type, chosen.format
    n_in = len(layer.inputs)
    call_plugin("configure_plugin", build.configure_plugin, in_out[:n_in], in_out[n_in:])
    tactics = list(call_plugin("get_valid_tactics", build.get_valid_tactics))
    call_plugin("set_tactic", build.set_tactic, tactics[0] if tactics else 0)
    _aot_kernel(build, layer, in_out, record)
    return record


def evaluate(exprs, env: dict) -> list:
    return [e.evaluate(env) for e in exprs]

