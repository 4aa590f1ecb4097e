"""One decoder interface, one serving-model interface: every implementation has exactly the
protocol's signatures (names, kinds, defaults), so a caller written against the protocol
works with each. (A tp=2 server failed every request when the rank-group proxy's step() took no
draft length, which the serving engine passes every round.)"""

import inspect

import pytest

from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.reference.records import DecoderProtocol
from trtllm_dflash.reference.verify import SamplingParams
from trtllm_dflash.runtime.engine_runners import EngineModel
from trtllm_dflash.runtime.local_model import LocalModel
from trtllm_dflash.runtime.sharded import ShardedModel, _RemoteDecoder
from trtllm_dflash.serve.batcher import ServingEngine, ServingModel

DECODERS = [Decoder, _RemoteDecoder]
MODELS = [LocalModel, ShardedModel, EngineModel]


def _params(fn) -> list[tuple]:
    """(name, kind, default) of every parameter but self: what a caller relies on."""
    return [(p.name, p.kind, p.default) for p in list(inspect.signature(fn).parameters.values())[1:]]


def _protocol_methods(protocol) -> list[str]:
    return [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]


CASES = [(DecoderProtocol, impl, ["admit", "cancel", "step"]) for impl in DECODERS] + \
        [(ServingModel, impl, ["close", "decoder", "release"]) for impl in MODELS]


@pytest.mark.parametrize("protocol,impl,methods", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_every_implementation_has_its_protocols_signatures(protocol, impl, methods):
    assert sorted(_protocol_methods(protocol)) == methods
    for name in methods:
        assert _params(getattr(impl, name)) == _params(getattr(protocol, name)), f"{impl.__name__}.{name}"
    if protocol is DecoderProtocol:  # running: a property, or an attribute every instance gets
        assert (isinstance(getattr(impl, "running", None), property)
                or "self.running" in inspect.getsource(impl.__init__))
    else:
        assert hasattr(impl, "failed")  # None, or why the model cannot serve
        # what its runners decode: a class attribute, a property or an attribute set at start-up
        assert hasattr(impl, "capabilities") or "self.capabilities" in inspect.getsource(impl.__init__)


def test_the_serving_engine_calls_models_as_the_protocol_says():
    """The keyword arguments ServingEngine passes to model.decoder() bind to the protocol."""

    class Stub:
        failed = None
        eos_token_ids = (0,)

    engine = ServingEngine(Stub(), tokenizer=None, mode="dflash", block_size=8, ddtree_budget=None, max_seq_len=64)
    try:
        inspect.signature(ServingModel.decoder).bind(None, sampling=SamplingParams(),
                                                      **{**engine.decoder_args, "mode": "ar"})
    finally:
        engine.stop()
