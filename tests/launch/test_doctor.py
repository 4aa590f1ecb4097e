"""`doctor` (launch/doctor.py): one line per check, ready only when every check passes; each
failure class driven by a stand-in of the machine (FakeBox), the files by a real CPU run to deploy."""

import json
import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.launch.doctor import (
    Gpu,
    check_attention,
    check_files_chain,
    check_gpus,
    check_parallel,
    check_plugins,
    check_versions,
    deployed_device_ids,
    doctor,
    ready,
)
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.hardware import GiB
from trtllm_dflash.recipe.plan.planner import plan

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
    modules: set = field(default_factory=lambda: {"flash_attn", "flash_attn.cute", "flashinfer", "mpi4py",
                                                  "cuda.bindings.runtime"})
    driver: str | None = "580.95.05"
    cuda_api: int | None = 13000  # a 580 driver's own CUDA 13.0

    def driver_version(self):
        return self.driver

    def cuda_driver_api(self):
        return self.cuda_api

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
    assert {c.name for c in checks} == {"versions", "gpus", "plugins", "mpi", "split", "nccl", "peer"}  # tp 8: split


@pytest.mark.parametrize("versions,bad", [
    ({"tensorrt_llm": "1.3.0rc27", "tensorrt": "10.14.1"}, "tensorrt_llm 1.3.0rc27"),
    ({"tensorrt_llm": "1.2.1", "tensorrt": "10.13.3"}, "tensorrt 10.13.3"),
    ({"tensorrt_llm": "1.2.1"}, "tensorrt not installed"),
    ({"tensorrt_llm": "1.20.0", "tensorrt": "10.14.1"}, "tensorrt_llm 1.20.0"),  # 1.2 is a line, not a prefix
])
def test_versions_off_the_engine_backends_lines_fail_naming_the_package(versions, bad):
    checks = check_versions(load_recipe(H100), FakeBox(versions=versions))
    (fail,) = [c for c in checks if c.status == "FAIL"]
    assert fail.detail.startswith(bad) and "Triton 26.07" in fail.detail


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
    assert the(check_gpus(r, FakeBox(devices=[replace(H100_GPU, free_bytes=math.ceil(need))] * 8)),
               "gpus").status == "ok"


def test_gpus_are_the_deployments_own_gpu_device_ids():
    """A tp 2 deployment on GPUs 6 and 7 of a shared node: their type and free memory are what
    counts, not GPUs 0 and 1 (another job's)."""
    r = load_recipe(H100, ["parallel.tp=2", "hardware.count=8"])
    need = plan(r).need_bytes
    busy = [replace(H100_GPU, free_bytes=int(need) - 1)] * 2 + [H100_GPU] * 6  # GPUs 0, 1: another job's
    assert [c.detail[:5] for c in check_gpus(r, FakeBox(devices=busy))] == ["GPU 0", "GPU 1"]
    ok = the(check_gpus(r, FakeBox(devices=busy), device_ids=[6, 7]), "gpus")
    assert ok.status == "ok" and "(GPUs 6, 7)" in ok.detail
    low = check_gpus(r, FakeBox(devices=busy[::-1]), device_ids=[6, 7])
    assert [(c.status, c.detail[:5]) for c in low] == [("FAIL", "GPU 6"), ("FAIL", "GPU 7")]
    gone = the(check_gpus(r, FakeBox(devices=busy), device_ids=[1, 9]), "gpus")
    assert gone.status == "FAIL" and "names GPU 9" in gone.detail
    # what the ranks refuse when the model loads (trt_runners.rank_devices), doctor refuses first
    for ids in ([6], [6, 6], [6, 7, 5], [-1, 7]):
        bad = the(check_gpus(r, FakeBox(devices=busy), device_ids=ids), "gpus")
        assert bad.status == "FAIL" and "need 2 distinct GPU ids" in bad.detail, ids
    one = load_recipe(H100, ["parallel.tp=1"])
    assert "at tp 1: the Executor runs on the first GPU" in the(check_gpus(one, FakeBox(devices=busy), [3]),
                                                                 "gpus").detail


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
    assert "FA4 imports flash_attn.cute" in the(check_attention(fa4, FakeBox(modules={"flash_attn"})),
                                                "attention").detail
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


def test_config_pbtxt_parameters_are_edited_in_place_and_checked_as_the_model_reads_them(engine_run, tmp_path):
    """docs/serving.md: the dflash model's settings are its config.pbtxt parameters, edited there
    (gpu_device_ids, torch_threads, ...). An edit passes the files check, which names the edited
    file; a parameter the model would refuse fails it with the model's own line."""
    run = copy_run(engine_run, tmp_path)
    r = load_recipe(ENGINE_CPU)
    config = run / "deploy/model_repository/dflash/config.pbtxt"
    text = config.read_text()
    config.write_text(text + 'parameters {\n  key: "gpu_device_ids"\n  value {\n    string_value: "0,1"\n  }\n}\n')
    ok = check_files_chain(r, run / "deploy")
    assert [c.status for c in ok] == ["ok", "FAIL"]  # the deploy output, then the dry-run build
    assert "edited since: model_repository/dflash/config.pbtxt" in ok[0].detail
    assert deployed_device_ids(r, run / "deploy") == [0, 1]
    config.write_text(text + 'parameters {\n  key: "torch_threads"\n  value {\n    string_value: "-1"\n  }\n}\n')
    bad = check_files_chain(r, run / "deploy")
    assert bad[-1].status == "FAIL" and bad[-1].detail == f"{config}: parameter torch_threads: -1, expected >= 0 " \
        "(0: the deployment's default)"


def test_files_fail_on_an_edited_file_a_missing_input_and_another_recipe(engine_run, tmp_path):
    run = copy_run(engine_run, tmp_path)
    r = load_recipe(ENGINE_CPU)
    recipe_copy = run / "deploy/model_repository/dflash/1/recipe.yaml"
    recipe_copy.write_text(recipe_copy.read_text() + "\n# edited\n")
    edited = check_files_chain(r, run / "deploy")
    assert edited[-1].status == "FAIL" and "recipe.yaml does not match its checksum" in edited[-1].detail
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
    # an edited config.pbtxt: checked as the model reads it, and what it opens must be the chain doctor read
    config = run / "deploy/model_repository/dflash/config.pbtxt"
    text = config.read_text()
    config.write_text(text.replace('key: "torch_threads"\n  value {\n    string_value: "0"',
                                   'key: "torch_threads"\n  value {\n    string_value: "1"'))
    assert main(["doctor", "--from", str(run / "deploy")]) == 0
    assert "edited since: model_repository/dflash/config.pbtxt" in capsys.readouterr().out
    shutil.copytree(run / "convert", tmp_path / "elsewhere")
    config.write_text(text.replace('string_value: "../convert"', f'string_value: "{tmp_path / "elsewhere"}"'))
    assert main(["doctor", "--from", str(run / "deploy")]) == 1
    assert f"config.pbtxt parameter checkpoint names {tmp_path / 'elsewhere'}, not a stage output this deployment " \
        "was made from" in capsys.readouterr().out


def test_peer_access_is_checked_among_the_deployments_own_gpus():
    r = load_recipe(H100, ["parallel.tp=2", "hardware.count=8"])
    box = FakeBox(blocked={(6, 7), (7, 6)})
    assert the(check_parallel(r, box), "peer").status == "ok"  # GPUs 0 and 1: not the blocked pair
    peer = the(check_parallel(r, box, device_ids=[6, 7]), "peer")
    assert peer.status == "FAIL" and peer.detail.startswith("GPU 6 cannot access GPU 7")
    assert "GPU 9" in the(check_parallel(r, box, device_ids=[1, 9]), "peer").detail  # only 8 visible


def test_a_split_drafter_needs_mpi4py_and_cuda_python():
    from trtllm_dflash.recipe.plan.drafter import drafter_placement

    r = load_recipe(H100, TP8 + ["parallel.drafter=split"])
    assert drafter_placement(r).mode == "split"
    assert the(check_parallel(r, FakeBox(modules={"mpi4py", "cuda.bindings.runtime"})), "split").status == "ok"
    # older cuda-python
    assert the(check_parallel(r, FakeBox(modules={"mpi4py", "cuda.cudart"})), "split").status == "ok"
    no_mpi = the(check_parallel(r, FakeBox(modules={"cuda.bindings.runtime"})), "split")
    assert no_mpi.status == "FAIL" and "mpi4py" in no_mpi.detail
    assert "cuda-python" in the(check_parallel(r, FakeBox(modules={"mpi4py"})), "split").detail
    rank0 = load_recipe(H100, TP8 + ["parallel.drafter=rank0"])
    assert "split" not in {c.name for c in check_parallel(rank0, FakeBox(modules=set()))}


def test_the_driver_must_be_as_new_as_the_images_cuda_needs():
    from trtllm_dflash.launch.doctor import check_driver

    r = load_recipe(H100)  # the engine backend: Triton 26.07, CUDA 13.1
    assert the(check_driver(r, FakeBox()), "driver").status == "ok"
    old = the(check_driver(r, FakeBox(driver="570.172.08", cuda_api=12080)), "driver")
    assert old.status == "FAIL" and "older than branch 580" in old.detail and "26.07-trtllm-python-py3" in old.detail
    # NVIDIA's forward-compatibility package runs the image's CUDA 13.1 on an older data-center driver
    compat = the(check_driver(r, FakeBox(driver="570.172.08", cuda_api=13010)), "driver")
    assert compat.status == "ok" and "forward compatibility to 13.1" in compat.detail
    assert the(check_driver(r, FakeBox(driver=None)), "driver").status == "cannot check"
    unknown = load_recipe(H100, ["backend.image=registry.example/ours:1"])
    assert the(check_driver(unknown, FakeBox(driver="570.1")), "driver").status == "cannot check"
    assert the(check_driver(load_recipe(ENGINE_CPU), FakeBox()), "driver").status == "n/a"
