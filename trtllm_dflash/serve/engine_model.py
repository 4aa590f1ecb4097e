"""The `dflash` Triton model for the engine backend (TensorRT-LLM 1.2.x engines).

Design (../shared/reference/engine-path.md, design C): a decoupled Python-backend model that
owns the TensorRT-LLM Executor for the target engine (with the DFlash context-feature and
argmax outputs) and our drafter engine (KV-injection plugin), and runs draft -> verify ->
accept in lock-step rounds across requests, sharing the request parsing and the greedy
accept rule with the reference backend.

NOT IMPLEMENTED YET: it needs the engine build stage (TensorRT-LLM 1.2.x on a GPU), which
has not landed. Loading this model fails loudly instead of serving something else.
"""


class TritonPythonModel:
    def initialize(self, args):
        raise NotImplementedError(
            "the engine backend's draft-verify orchestrator is not implemented yet: it needs the engine "
            "build stage (TensorRT-LLM 1.2.x + TensorRT 10.14 on a GPU). Serve this recipe with the "
            "reference backend, or use the pytorch backend (TensorRT-LLM >= 1.3) on GPUs."
        )

    def execute(self, requests):  # pragma: no cover - initialize always raises
        raise NotImplementedError("engine backend not implemented")
