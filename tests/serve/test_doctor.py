"""`doctor` (launch/doctor.py): one line per check, ready only when every check passes; each
failure class driven by a stand-in of the machine (FakeBox), the files by a real CPU run to deploy."""

import json
import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.hardware import GiB
from trtllm_dflash.recipe.planner import plan
from trtllm_dflash.launch.doctor import (
    Gpu,
    check_attention,
    check_files_chain,
    check_gpus,
    check_parallel,
    check_plugins,
    check_versions,
    doctor,
    ready,
)

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"
TP8 = ["parallel.tp=8", "hardware.count=8"]
ENGINE_CPU = ROOT / "recipes/cpu/tiny-pystd-engine.yaml"
OURS = ["trtllm_dflash::kv_append", "trtllm_dflash::kv_inject_attention"]
H100_GPU = Gpu("NVIDIA H100 80GB HBM3", 90, 80 * 10**9, 79 * 10**9)


@dataclass
class FakeBox:
    """A machine as doctor reads it (launch/doctor.py Box): what a test sets is what it finds."""

    versions: dict = field(default_factory=lambda: {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48"})
    devices: list = field(default_factory=lambda: [H100_GPU] * 8)
    blocked: set = field(default_factory=set)  # (a, b) pairs without peer access
    path: dict = field(default_factory=lambda: {"mpirun": "/usr/local/mpi/bin/mpirun"})
    nccl: str | None = "2.27.7"
    registered: tuple = (["tensorrt", "tensorrt_llm", "trtllm_dflash"], OURS)
    raises: Exception | None = None
    modules: set = field(default_factory=lambda: {"flash_attn", "flash_attn.cute", "flashinfer"})

    def version(self, package):
        return self.versions.get(package)

    def gpus(self):
        return self.devices

    def peer_access(self, a, b):
        return (a, b) not in self.blocked

    def which(self, program):
        return self.path.get(program)

    def nccl_version(self):
        return self.nccl

    def importable(self, module):
        return module in self.modules

    def plugins(self):
        if self.raises is not None:
            raise self.raises
        return self.registered


def statuses(checks, name):
    return [c.status for c in checks if c.name == name]


def the(checks, name):
    (c,) = [c for c in checks if c.name == name]
    return c


def test_a_box_with_everything_passes_every_machine_check():
    r = load_recipe(H100, TP8)
    box = FakeBox()
    checks = [*check_versions(r, box), *check_gpus(r, box), *check_plugins(r, box), *check_parallel(r, box)]
    assert ready(checks) and {c.status for c in checks} == {"ok"}
    assert check_attention(r, box)[0].status == "n/a"  # the engine backend's drafter attention is our plugin
    assert {c.name for c in checks} == {"versions", "gpus", "plugins", "mpi", "nccl", "peer"}


@pytest.mark.parametrize("versions,bad", [
    ({"tensorrt_llm": "1.3.0rc27", "tensorrt": "10.14.1"}, "tensorrt_llm 1.3.0rc27"),
    ({"tensorrt_llm": "1.2.1", "tensorrt": "10.13.3"}, "tensorrt 10.13.3"),
    ({"tensorrt_llm": "1.2.1"}, "tensorrt not installed"),
    ({"tensorrt_llm": "1.20.0", "tensorrt": "10.14.1"}, "tensorrt_llm 1.20.0"),  # 1.2 is a line, not a prefix
])
def test_versions_off_the_engine_backends_lines_fail_naming_the_package(versions, bad):
    checks = check_versions(load_recipe(H100), FakeBox(versions=versions))
    (fail,) = [c for c in checks if c.status == "FAIL"]
    assert fail.detail.startswith(bad) and "Triton 25.12" in fail.detail


def test_the_pytorch_backend_needs_13_or_14_and_the_reference_backend_nothing():
    gpt_oss = load_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", check_rules=False)
    assert statuses(check_versions(gpt_oss, FakeBox()), "versions") == ["FAIL"]  # 1.2.1: the engine line
    assert statuses(check_versions(gpt_oss, FakeBox(versions={"tensorrt_llm": "1.4.0rc1"})), "versions") == ["ok"]
    assert statuses(check_versions(load_recipe(None), FakeBox(versions={})), "versions") == ["n/a"]


def test_gpus_count_type_and_free_memory_against_the_plan():
    r = load_recipe(H100, TP8)
    need = plan(r).need_bytes
    assert the(check_gpus(r, FakeBox(devices=[])), "gpus").status == "cannot check"
    few = the(check_gpus(r, FakeBox(devices=[H100_GPU] * 4)), "gpus")
    assert few.status == "FAIL" and "4 GPU(s) visible" in few.detail and "needs 8" in few.detail
    a100 = [H100_GPU] * 7 + [Gpu("NVIDIA A100-SXM4-80GB", 80, 80 * 10**9, 79 * 10**9)]
    assert "GPU 7 is NVIDIA A100" in the(check_gpus(r, FakeBox(devices=a100)), "gpus").detail
    busy = [H100_GPU] * 3 + [replace(H100_GPU, free_bytes=int(need) - 1)] + [H100_GPU] * 4
    low = the(check_gpus(r, FakeBox(devices=busy)), "gpus")
    assert low.status == "FAIL" and low.detail.startswith("GPU 3") and f"{need / GiB:.1f} GiB per rank" in low.detail
    assert the(check_gpus(r, FakeBox(devices=[replace(H100_GPU, free_bytes=math.ceil(need))] * 8)), "gpus").status == "ok"


def test_plugins_fail_when_the_library_or_ours_do_not_register():
    r = load_recipe(H100)
    assert "RuntimeError: libnvinfer_plugin" in the(check_plugins(r, FakeBox(raises=RuntimeError(
        "libnvinfer_plugin_tensorrt_llm.so: cannot open shared object file"))), "plugins").detail
    no_lib = the(check_plugins(r, FakeBox(registered=(["trtllm_dflash"], OURS))), "plugins")
    assert no_lib.status == "FAIL" and "plugin library did not load" in no_lib.detail
    one = the(check_plugins(r, FakeBox(registered=(["tensorrt_llm"], OURS[1:]))), "plugins")
    assert one.status == "FAIL" and one.detail.startswith("trtllm_dflash::kv_append")
    assert the(check_plugins(r, FakeBox(versions={})), "plugins").status == "cannot check"
    assert the(check_plugins(load_recipe(None), FakeBox()), "plugins").status == "n/a"


def test_the_pytorch_backends_drafter_attention_needs_its_packages():
    coder = load_recipe(ROOT / "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml")
    assert the(check_attention(coder, FakeBox()), "attention").status == "ok"
    bare = the(check_attention(coder, FakeBox(modules=set())), "attention")
    assert bare.status == "FAIL" and "VANILLA imports flash_attn" in bare.detail
    fa4 = load_recipe(coder.file, ["backend.drafter_attention=FA4"])
    assert "FA4 imports flash_attn.cute" in the(check_attention(fa4, FakeBox(modules={"flash_attn"})), "attention").detail
    gpt_oss = load_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml")
    assert "TRTLLM imports flashinfer" in the(check_attention(gpt_oss, FakeBox(modules=set())), "attention").detail
    assert the(check_attention(load_recipe(H100), FakeBox(modules=set())), "attention").status == "n/a"


def test_mpi_nccl_and_peer_access_at_tp8():
    r = load_recipe(H100, TP8)
    assert the(check_parallel(r, FakeBox(path={})), "mpi").status == "FAIL"
    assert the(check_parallel(r, FakeBox(nccl=None)), "nccl").status == "FAIL"
    peer = the(check_parallel(r, FakeBox(blocked={(2, 5), (5, 2)})), "peer")
    assert peer.status == "FAIL" and peer.detail.startswith("GPU 2 cannot access GPU 5") and "2 pair(s)" in peer.detail
    assert {c.status for c in check_parallel(r, FakeBox(devices=[]))} == {"ok", "cannot check"}
    assert {c.status for c in check_parallel(load_recipe(H100), FakeBox(path={}, nccl=None))} == {"n/a"}


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """The CPU engine recipe run to deploy (convert, a dry-run build, deploy)."""
    base = tmp_path_factory.mktemp("doctor")
    run = base / "runs" / "cpu-tiny-pystd-engine"
    assert main(["run", str(ENGINE_CPU), "--until", "deploy", "--out", str(run)]) == 0
    return run


def copy_run(engine_run, tmp_path) -> Path:
    dst = tmp_path / "runs" / engine_run.name
    shutil.copytree(engine_run, dst, symlinks=True)
    return dst


def test_files_walk_the_chain_and_a_dry_run_build_fails_naming_what_to_do(engine_run):
    r = load_recipe(ENGINE_CPU)
    checks = check_files_chain(r, engine_run / "deploy")
    assert [c.status for c in checks] == ["ok", "FAIL"]
    assert "a dry-run build (no engines)" in checks[1].detail and "trtllm-dflash build" in checks[1].detail
    assert json.loads((engine_run / "build" / "manifest.json").read_text())["extra"]["dry_run"] is True


def test_files_fail_on_an_edited_file_a_missing_input_and_another_recipe(engine_run, tmp_path):
    run = copy_run(engine_run, tmp_path)
    r = load_recipe(ENGINE_CPU)
    config = next(p for p in (run / "deploy").rglob("config.pbtxt"))
    config.write_text(config.read_text() + "\n# edited\n")
    edited = check_files_chain(r, run / "deploy")
    assert edited[-1].status == "FAIL" and "config.pbtxt" in edited[-1].detail
    other = check_files_chain(load_recipe(ENGINE_CPU, ["build.max_batch_size=8"]), run / "deploy")
    assert [c.status for c in other] == ["FAIL"] and "recipe_fields.build" in other[0].detail
    assert [c.status for c in check_files_chain(r, tmp_path / "nowhere")] == ["FAIL"]


def test_doctor_on_this_cpu_machine_reports_what_it_cannot_check(engine_run, capsys):
    rc = main(["doctor", str(ENGINE_CPU), "--from", str(engine_run / "deploy")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and out[-1].startswith("not ready:")
    assert any(line.startswith("FAIL") and "tensorrt_llm not installed" in line for line in out)
    assert any(line.startswith("cannot check plugins") for line in out)
    checks = doctor(load_recipe(ENGINE_CPU), engine_run / "deploy", FakeBox())
    assert not ready(checks) and [c.name for c in checks if c.status == "FAIL"] == ["files"]


def test_a_cpu_reference_deployment_is_ready_here(tmp_path, capsys):
    run = tmp_path / "runs" / "cpu-tiny-pystd"
    assert main(["run", "--until", "deploy", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["doctor", "--from", str(run / "deploy")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("ready:") and [line.split()[0] for line in out[:-1]].count("ok") == 2  # deploy, convert
