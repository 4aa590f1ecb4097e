"""The pytorch backend behind Triton runs TensorRT-LLM's LLM-API model.py, which every launch line
copies into the deployed repository first (launch/llmapi_model.py); a multi-rank launch is refused
when that model.py deletes the MPI job environment at import, as upstream's does on the main line
(triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @044a90d: ranks started by
trtllm-llmapi-launch would never join). The model.py texts below are small ones written here, one
of each kind, not upstream's file."""

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from test_cluster_launchers import after_prelude, flag, parse_sbatch, rank, written
from test_serve_gpu_commands import GPT_OSS, deploy_gpt_oss_standin

from trtllm_dflash.cli import main
from trtllm_dflash.launch.llmapi_model import MODEL_DIR_ENV, LLMAPIModel, clears_mpi_test

CLEARING = {  # name: model.py text that deletes the MPI job environment at import
    "a set over lines": ("import os\n_JOB = {\n    'OMPI_COMM_WORLD_SIZE',\n    'OMPI_COMM_WORLD_RANK',\n"
                         "    'PMIX_RANK',\n}\nfor k in list(os.environ):\n    if k in _JOB:\n"
                         "        del os.environ[k]\n"),
    "a set on one line": ('import os\nfor k in {"PMI_RANK", "OMPI_COMM_WORLD_RANK"}:\n'
                          "    os.environ.pop(k, None)\n"),
}
KEEPING = {  # name: model.py text that leaves it alone (reads the rank, removes something else)
    "reads the rank": ("import os\nRANK = int(os.environ.get('OMPI_COMM_WORLD_RANK', '0'))\n"
                       "SIZE = os.environ['OMPI_COMM_WORLD_SIZE']\nos.environ.pop('CUDA_LAUNCH_BLOCKING', None)\n"),
    "never mentions MPI": "import yaml\n\nclass TritonPythonModel:\n    pass\n",
}


def model_dir(root: Path, text: str) -> Path:
    """An LLM-API model directory (DIR/1/model.py, DIR/1/helpers.py) around `text`."""
    (root / "1").mkdir(parents=True)
    (root / "1" / "model.py").write_text(text)
    (root / "1" / "helpers.py").write_text("# helpers\n")
    return root


@pytest.mark.parametrize("name", sorted(CLEARING) + sorted(KEEPING))
def test_the_clearing_model_py_is_told_from_one_that_keeps_the_mpi_environment(tmp_path, name):
    path = tmp_path / "model.py"
    path.write_text({**CLEARING, **KEEPING}[name])
    r = subprocess.run(["bash", "-c", clears_mpi_test(shlex.quote(str(path)))], timeout=30)
    assert r.returncode == (0 if name in CLEARING else 1)


def run_step(model: LLMAPIModel, multi_rank: bool, env: dict) -> subprocess.CompletedProcess:
    cmd = model.wrapped(["echo", "server started"], multi_rank)
    return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=30)


def test_the_launch_step_copies_the_images_model_then_refuses_only_a_multi_rank_launch_that_clears(tmp_path):
    version = tmp_path / "deploy" / "model_repository" / "dflash" / "1"
    version.mkdir(parents=True)
    clearing = model_dir(tmp_path / "clearing", CLEARING["a set over lines"])
    keeping = model_dir(tmp_path / "keeping", KEEPING["reads the rank"])
    model = LLMAPIModel(version)
    for source in (clearing, keeping):  # one rank: any model.py serves (the LLM spawns its workers itself)
        r = run_step(model, False, {MODEL_DIR_ENV: str(source)})
        assert r.returncode == 0 and r.stdout == "server started\n", r.stderr
        assert (version / "model.py").read_text() == (source / "1" / "model.py").read_text()
        assert (version / "helpers.py").is_file() and not list(version.glob(".*"))  # no temporary left
    r = run_step(model, True, {MODEL_DIR_ENV: str(keeping)})
    assert r.returncode == 0 and r.stdout == "server started\n", r.stderr
    r = run_step(model, True, {MODEL_DIR_ENV: str(clearing)})
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "deletes the MPI environment at import" in r.stderr
    assert "--launcher single_node" in r.stderr and "--api openai" in r.stderr
    # An explicit directory wins over the image's.
    r = run_step(LLMAPIModel(version, keeping), True, {MODEL_DIR_ENV: str(clearing)})
    assert r.returncode == 0, r.stderr


def test_without_a_model_directory_the_launch_stops_in_one_line(tmp_path):
    version = tmp_path / "1"
    version.mkdir()
    env = {k: v for k, v in os.environ.items() if k != MODEL_DIR_ENV}
    r = subprocess.run(LLMAPIModel(version).wrapped(["echo", "server started"], False), env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1
    assert f"no TensorRT-LLM LLM-API model in ${MODEL_DIR_ENV}" in r.stderr and "--llmapi-model DIR" in r.stderr
    assert not (version / "model.py").exists()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    return deploy_gpt_oss_standin(tmp_path_factory.mktemp("pytorch"))[0]


def serve(capsys, deployed, *args) -> tuple[int, str, str]:
    rc = main(["serve", str(GPT_OSS), "--from", str(deployed), *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_serve_names_the_given_model_directory_and_mounts_it(capsys, deployed, tmp_path):
    keeping = model_dir(tmp_path / "keeping", KEEPING["reads the rank"])
    rc, out, err = serve(capsys, deployed, "--llmapi-model", keeping, "--container", "image:1")
    assert rc == 0, err
    cmd = shlex.split(out.strip())
    image = cmd.index("image:1")
    assert f"{keeping}:{keeping}" in [cmd[i + 1] for i, a in enumerate(cmd[:image]) if a == "-v"]
    prelude, server = after_prelude(cmd[image + 1:])
    assert f"src={keeping}" in prelude and server[0] == "/opt/tritonserver/bin/tritonserver"
    rc, out, err = serve(capsys, deployed, "--llmapi-model", keeping, "--launcher", "srun", "--image", "i:1")
    assert rc == 0, err
    _, srun = parse_sbatch(written(out).read_text())
    assert f"{keeping}:{keeping}:ro" in flag(srun, "--container-mounts").split(",")
    assert f"src={keeping}" in after_prelude(rank(srun))[0]


@pytest.mark.parametrize("launcher", ["mpirun", "srun", "k8s"])
def test_a_multi_rank_launch_of_a_clearing_model_py_is_refused_before_anything_is_written(capsys, deployed,
                                                                                          tmp_path, launcher):
    clearing = model_dir(tmp_path / "clearing", CLEARING["a set on one line"])
    rc, out, err = serve(capsys, deployed, "--llmapi-model", clearing, "--launcher", launcher, "--image", "i:1")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert f"{clearing}/1/model.py: this TensorRT-LLM model.py deletes the MPI environment" in err
    rc, out, err = serve(capsys, deployed, "--llmapi-model", clearing)  # single_node: one tritonserver
    assert rc == 0, err


def test_llmapi_model_is_refused_where_it_has_no_use(capsys, deployed, tmp_path):
    rc, _, err = serve(capsys, deployed, "--llmapi-model", tmp_path, "--api", "openai")
    assert rc == 2 and "--llmapi-model: only the pytorch backend served by Triton (--api triton)" in err
    rc, _, err = serve(capsys, deployed, "--llmapi-model", tmp_path)
    assert rc == 2 and err.count("\n") == 1 and f"--llmapi-model {tmp_path.resolve()}: no 1/model.py" in err
