"""NVIDIA Dynamo's own facts, as the product writes against them: recipe/catalog/dynamo-1.6.1.yaml
(the flags of `python3 -m dynamo.trtllm` and `python3 -m dynamo.frontend`, what the TensorRT-LLM
worker owns among the LLM arguments, the wheel's aggregated DynamoGraphDeployment template, each
with the file and line of the ai-dynamo 1.6.1 wheel it was read from) and
recipe/catalog/dgd-v1beta1.schema.json (the DynamoGraphDeployment CRD's v1beta1 schema, cut down to
what we write; its header names the commit and what is unconfirmed about it). Read by deploy (the
worker's engine-args YAML, deploy/dynamo.py), the Dynamo launchers (launch/dynamo*.py) and
`project` (the router it assumes).

Every command the product writes goes through `checked`: a flag that is not one of the pinned
version's, a value outside its choices or a boolean flag given a value is a bug here, raised
before anything is printed or written.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml

CATALOG = Path(__file__).parent / "catalog"
FACTS = CATALOG / "dynamo-1.6.1.yaml"
DGD_SCHEMA = CATALOG / "dgd-v1beta1.schema.json"
DGD_API = "nvidia.com/v1beta1"
DGD_KIND = "DynamoGraphDeployment"
PROCESSES = {"worker": "dynamo.trtllm", "frontend": "dynamo.frontend"}


@functools.cache
def facts() -> dict:
    return yaml.safe_load(FACTS.read_text())


@functools.cache
def dgd_schema() -> dict:
    return json.loads(DGD_SCHEMA.read_text())


def version() -> str:
    """The Dynamo release the facts were read from."""
    return str(facts()["dynamo"])


def trtllm_version() -> str:
    """The TensorRT-LLM that release pins (its tensorrtllm-runtime image carries it)."""
    return str(facts()["trtllm"]["version"])


def flags(process: str) -> dict[str, dict]:
    """`process` ("worker" or "frontend"): its flags we write, by name."""
    return facts()[process]["flags"]


def choices(process: str, flag: str) -> list[str]:
    return list(flags(process)[flag]["choices"])


def worker_owned() -> dict[str, str | None]:
    """LLM-argument keys the TensorRT-LLM worker sets itself -> its flag for them (None: no flag;
    its own default stands). The engine-args YAML leaves them out: its keys would replace them."""
    return dict(facts()["engine_args"]["flag_owned"])


def checked(process: str, argv: list[str]) -> list[str]:
    """`argv` (the arguments after `python3 -m MODULE`), after checking every flag against the
    pinned version's: known, a value where it takes one, the value among its choices."""
    known = {alias: (name, spec) for name, spec in flags(process).items() for alias in [name, *spec.get("aliases", [])]}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token not in known:
            raise AssertionError(f"{PROCESSES[process]} {version()}: {token!r} is not a flag we know it has "
                                 f"({FACTS.name})")
        name, spec = known[token]
        if spec["type"] == "bool":
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            raise AssertionError(f"{PROCESSES[process]} {version()}: {name} takes a value")
        value = argv[i + 1]
        if spec.get("choices") and value not in spec["choices"]:
            raise AssertionError(f"{PROCESSES[process]} {version()}: {name} {value!r}: not one of {spec['choices']}")
        if spec["type"] == "int":
            int(value)
        i += 2
    return argv


def command(process: str, argv: list[str]) -> list[str]:
    """`python3 -m MODULE ARGV`, checked."""
    return ["python3", "-m", PROCESSES[process], *checked(process, argv)]


def router(recipe) -> tuple[str, str]:
    """(the frontend's --router-mode, why) for a deployment of `recipe`: the KV router where the
    workers keep reused prefixes (block reuse on, which needs TensorRT-LLM's recompute tail for
    DFlash: recipe/rules.py recompute_tail) and publish their KV events; else round-robin, the
    frontend's default, since without reuse there is no cache overlap to route on (the 1.6.1
    worker warns so itself when block reuse is off)."""
    from trtllm_dflash.recipe.rules import recompute_tail
    from trtllm_dflash.recipe.support import backend as backend_spec

    version = recipe.backend.trtllm_version or backend_spec(recipe.backend.name).default_trtllm_version
    if version and recompute_tail(recipe, version):
        return "kv", (f"KV-aware: TensorRT-LLM {version} reuses prefix blocks for this target (a recompute tail keeps "
                      "the drafter's context), so workers publish KV events and the frontend routes by cache overlap")
    default = flags("frontend")["--router-mode"]["default"]
    return default, (f"{default} (the Dynamo frontend's default): prefix-block reuse is off "
                     f"(TensorRT-LLM {version} has no recompute tail for DFlash here), so there is no cache overlap "
                     "to route on")
