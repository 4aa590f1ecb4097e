"""A stand-in of tensorrt_llm/graph_rewriting.py (NVIDIA/TensorRT-LLM @138f96d and @b57221b, the
1.2-era copies) as strict as upstream where our drafter network meets it: tensorrt_llm/builder.py
build() runs `optimize(network)`, whose FuseAttentionWithBiasPass has no root layer type, so it
visits every layer of the network and calls `Layer.as_layer()`; as_layer looks the layer's type up
in `Layer.TRT_LAYER_TYPE_TO_LAYER` and raises NotImplementedError("Unknown layer type: ...") for a
type the map lacks. Upstream's map lists PLUGIN_V2 but not PLUGIN_V3, the type of the AOT
plugin layers `network.add_plugin(..., aot=True)` adds. Only the map and the visit are mirrored;
the rewrite itself (fusing a bias into GPTAttention) never applies to our layers.

`tensorrt(...)` is the matching slice of the `tensorrt` module: LayerType and the layer classes
the map names.
"""

from __future__ import annotations

import enum
import types

import stand_in

LayerType = enum.Enum("LayerType", ["CONSTANT", "ELEMENTWISE", "SHUFFLE", "MATRIX_MULTIPLY", "PLUGIN_V2", "PLUGIN_V3"])


class ILayer:
    def __init__(self, type_: LayerType, plugin=None):
        self.type, self.plugin, self.name = type_, plugin, f"{type_.name.lower()}_{id(self)}"


class IConstantLayer(ILayer): ...


class IElementWiseLayer(ILayer): ...


class IShuffleLayer(ILayer): ...


class IMatrixMultiplyLayer(ILayer): ...


class IPluginV2Layer(ILayer): ...


class IPluginV3Layer(ILayer): ...


def tensorrt(**attrs) -> types.ModuleType:
    trt = stand_in.module("tensorrt")
    trt.__dict__.update(attrs, LayerType=LayerType, ILayer=ILayer, IConstantLayer=IConstantLayer,
                        IElementWiseLayer=IElementWiseLayer, IShuffleLayer=IShuffleLayer,
                        IMatrixMultiplyLayer=IMatrixMultiplyLayer, IPluginV2Layer=IPluginV2Layer,
                        IPluginV3Layer=IPluginV3Layer)
    return trt


def graph_rewriting() -> types.ModuleType:
    """A fresh `tensorrt_llm.graph_rewriting` (its map is a class attribute: one per module)."""

    class Layer:
        TRT_LAYER_TYPE_TO_LAYER = {
            LayerType.CONSTANT: IConstantLayer, LayerType.ELEMENTWISE: IElementWiseLayer,
            LayerType.SHUFFLE: IShuffleLayer, LayerType.MATRIX_MULTIPLY: IMatrixMultiplyLayer,
            LayerType.PLUGIN_V2: IPluginV2Layer,
        }

        def __init__(self, network, trt_layer):
            self.network, self.trt_layer = network, trt_layer

        @property
        def type(self):
            return self.trt_layer.type

        def as_layer(self):
            if self.type in self.TRT_LAYER_TYPE_TO_LAYER:
                self.trt_layer.__class__ = self.TRT_LAYER_TYPE_TO_LAYER[self.type]
                return self.trt_layer
            raise NotImplementedError(f"Unknown layer type: {self.type}")

    class FuseAttentionWithBiasPass:
        root_layer = None  # every layer

        @staticmethod
        def is_attention_plugin(layer) -> bool:
            if layer.as_layer().type != LayerType.PLUGIN_V2:
                return False
            p = layer.as_layer().plugin
            return p.plugin_namespace == "tensorrt_llm" and p.plugin_type == "GPTAttention"

        def match_and_rewrite(self, layer) -> bool:
            return self.is_attention_plugin(layer) and False  # never ours (see the module docstring)

    def optimize(network) -> None:
        rewrite = FuseAttentionWithBiasPass()
        for trt_layer in network.layers:
            rewrite.match_and_rewrite(Layer(network, trt_layer))

    m = stand_in.module("tensorrt_llm.graph_rewriting")
    m.Layer, m.FuseAttentionWithBiasPass, m.optimize = Layer, FuseAttentionWithBiasPass, optimize
    return m
