"""The dflash model's settings (deploy/settings.py): one typed record between deploy and serve.

Every setting round-trips through config.pbtxt's string parameters; every setting serve has is
read where the deployment is opened (serve/deployed.py), and every key deploy writes is one of
them; nothing else in the package reads or writes those keys by name; bad values and keys of
another version are refused by name."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from trtllm_dflash.deploy.settings import ModelSettings
from trtllm_dflash.errors import UserError

PACKAGE = Path(__file__).resolve().parents[2] / "trtllm_dflash"
NAMES = [f.name for f in fields(ModelSettings)]


def test_every_setting_round_trips_through_string_parameters():
    s = ModelSettings(recipe="r.yaml", runners="tensorrt", checkpoint="/c", checkpoint_manifest_sha256="ab",
                      engine_dir="/e", kv_cache_free_gpu_mem_fraction=0.5, gpu_device_ids="0,1", torch_threads=3)
    params = s.to_params()
    assert set(params) == set(NAMES) and all(isinstance(v, str) for v in params.values())
    assert ModelSettings.from_params(params) == s
    assert ModelSettings.from_params(ModelSettings().to_params()) == ModelSettings()


def test_serve_reads_every_setting_where_it_opens_a_deployment():
    source = (PACKAGE / "serve" / "deployed.py").read_text()
    as_read = {"gpu_device_ids": "device_ids"}  # read through ModelSettings' typed property
    unread = [n for n in NAMES if not re.search(rf"\bs\.{as_read.get(n, n)}\b|\bsettings\.{n}\b", source)]
    assert not unread, f"settings serve never reads (drop them or read them): {unread}"


def test_deploy_writes_only_settings(tmp_path):
    from google.protobuf import text_format
    from test_deploy import CASES, generate  # noqa: F401  (the golden deployments)
    from tritonclient.grpc import model_config_pb2 as mc

    for name in ("reference.config.pbtxt", "engine.config.pbtxt"):
        cfg = text_format.Parse(generate(name, tmp_path / name), mc.ModelConfig())
        assert set(cfg.parameters) <= set(NAMES), name
        ModelSettings.from_params({k: v.string_value for k, v in cfg.parameters.items()}, name)


def test_no_other_module_spells_the_setting_keys():
    allowed = {PACKAGE / "deploy" / "settings.py", PACKAGE / "launch" / "overlay.py"}
    # `recipe`, `runners` and `checkpoint` are ordinary words in the package; the others are not
    keys = [n for n in NAMES if n not in ("recipe", "runners", "checkpoint")]
    def spelled(k: str) -> str:  # a parameter read or written by key: x["k"], x.get("k", ...), {"k": ...}
        return rf"\[\s*[\"']{k}[\"']\s*\]|\.get\(\s*[\"']{k}[\"']|[\"']{k}[\"']\s*:"

    hits = [f"{p.relative_to(PACKAGE)}: {k}" for p in PACKAGE.rglob("*.py") if p not in allowed
            for k in keys if re.search(spelled(k), p.read_text())]
    assert not hits, hits


@pytest.mark.parametrize("params,message", [
    ({"tensor_parallel": "2"}, "parameter 'tensor_parallel' is not a dflash model setting"),
    ({"torch_threads": "two"}, "parameter torch_threads: 'two' is not an integer"),
    ({"kv_cache_free_gpu_mem_fraction": "x"}, "parameter kv_cache_free_gpu_mem_fraction: 'x' is not a number"),
    ({"kv_cache_free_gpu_mem_fraction": "1.5"}, "kv_cache_free_gpu_mem_fraction: 1.5, expected 0 < f <= 1"),
    ({"runners": "gpu"}, "runners: 'gpu', allowed: reference, emulated, tensorrt"),
    ({"torch_threads": "-1"}, "torch_threads: -1, expected >= 0"),
])
def test_bad_parameters_are_refused_by_name(params, message):
    with pytest.raises(UserError, match=re.escape(message)):
        ModelSettings.from_params(params, "model 'dflash' config.pbtxt")
