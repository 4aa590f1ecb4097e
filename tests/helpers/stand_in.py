"""A module object for a stand-in of an upstream package, as `import` would make it: with a
module spec, so that importlib.util.find_spec(name) answers for it instead of raising
("tensorrt.__spec__ is None"), as torch._dynamo's trace rules ask of every module they know."""

import importlib.machinery
import types


def module(name: str) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    return m
