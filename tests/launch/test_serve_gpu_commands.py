"""`serve` for the GPU backends prints (or runs) the launch command for NVIDIA's container:
tritonserver over the repository, or trtllm-serve exactly as deploy wrote it to launch.json."""

import contextlib
import io
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from test_cluster_launchers import after_prelude

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.stages import input_stage

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"


def deploy_gpt_oss_standin(root: Path) -> tuple[Path, Path]:
    """(deploy output, its input) of the gpt-oss recipe over a stand-in quantize output in `root`
    (deploy reads manifests only)."""
    recipe = load_recipe(GPT_OSS)
    stage = input_stage(recipe, "deploy")
    with atomic_stage_dir(root / stage, Manifest.for_stage(stage, recipe, extra={"layout": "hf"})) as d:
        (d / "weights.safetensors").write_bytes(b"stand-in")
    return deploy(recipe, root / stage, root / "deploy"), (root / stage).resolve()


@pytest.fixture(scope="module")
def deployed_pytorch(tmp_path_factory):
    return deploy_gpt_oss_standin(tmp_path_factory.mktemp("pytorch"))


def serve(*args, recipe: Path = GPT_OSS) -> subprocess.CompletedProcess:
    """`trtllm-dflash serve RECIPE ARGS` in process (`python -m trtllm_dflash` exits with main's
    return value): what it prints and returns, without an interpreter start per call."""
    from trtllm_dflash.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["serve", str(recipe), *map(str, args)])
    return subprocess.CompletedProcess(["serve", str(recipe), *map(str, args)], rc, out.getvalue(), err.getvalue())


def test_openai_api_prints_the_deployed_trtllm_serve_command(deployed_pytorch):
    out, artifact = deployed_pytorch
    launch = json.loads((out / "trtllm_serve/launch.json").read_text())
    r = serve("--from", out, "--api", "openai")
    assert r.returncode == 0, r.stderr
    assert shlex.split(r.stdout.strip()) == launch["single_node"]
    r = serve("--from", out, "--api", "openai", "--launcher", "mpirun", "--host", "0.0.0.0", "--http-port", "9000")
    cmd = shlex.split(r.stdout.strip())
    assert cmd[:5] == ["mpirun", "--allow-run-as-root", "-n", "8", "trtllm-llmapi-launch"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "9000"
    # --launcher srun writes a batch script around the same command (tests/launch/test_cluster_launchers.py).
    assert launch["srun"][:6] == ["srun", "-N", "1", "--ntasks-per-node=8", "--mpi=pmix", "trtllm-llmapi-launch"]


def test_container_wraps_the_command_and_mounts_what_it_reads(deployed_pytorch):
    out, artifact = deployed_pytorch
    r = serve("--from", out, "--api", "openai", "--container", "example/tensorrt-llm:1.3.0")
    cmd = shlex.split(r.stdout.strip())
    image = cmd.index("example/tensorrt-llm:1.3.0")
    assert cmd[:3] == ["docker", "run", "--rm"] and cmd[image + 1] == "trtllm-serve"
    mounts = [cmd[i + 1] for i, a in enumerate(cmd[:image]) if a == "-v"]
    assert f"{out.resolve()}:{out.resolve()}" in mounts and f"{artifact}:{artifact}" in mounts


def test_triton_api_runs_one_tritonserver_on_a_node(deployed_pytorch):
    out, _ = deployed_pytorch
    prelude, cmd = after_prelude(shlex.split(serve("--from", out).stdout.strip()))
    # The LLM-API model spawns its tp workers itself: one server, auto-complete off, no mpirun;
    # TensorRT-LLM's model.py is copied in first (launch/llmapi_model.py), its MPI clearing is harmless here.
    assert cmd[0] == "/opt/tritonserver/bin/tritonserver" and "--disable-auto-complete-config" in cmd
    assert f"--model-repository={(out / 'model_repository').resolve()}" in cmd
    assert "$TRTLLM_LLMAPI_MODEL_DIR" in prelude and "OMPI_COMM_WORLD_RANK" not in prelude
    prelude, cmd = after_prelude(shlex.split(serve("--from", out, "--launcher", "mpirun").stdout.strip()))
    assert cmd[:5] == ["mpirun", "--allow-run-as-root", "-n", "8", "trtllm-llmapi-launch"] and cmd.count("-n") == 1
    assert "OMPI_COMM_WORLD_RANK" in prelude  # several ranks: a model.py that clears their environment is refused


def test_run_outside_the_container_says_where_to_run(deployed_pytorch):
    out, _ = deployed_pytorch
    r = serve("--from", out, "--api", "openai", "--run")
    assert r.returncode == 2
    assert "trtllm-serve: not found on PATH; run this inside NVIDIA's TensorRT-LLM container" in r.stderr
    assert "Traceback" not in r.stderr


def test_engine_backend_has_no_openai_endpoint(tmp_path):
    recipe_path = ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"
    recipe = load_recipe(recipe_path)
    with atomic_stage_dir(tmp_path / "build", Manifest.for_stage("build", recipe)) as d:
        (d / "x").write_bytes(b"stand-in")
    out = deploy(recipe, tmp_path / "build", tmp_path / "deploy")
    r = serve("--from", out, "--api", "openai", recipe=recipe_path)
    assert r.returncode == 2 and "--api openai: the engine backend serves Triton only" in r.stderr


def test_engine_backend_launches_one_tritonserver_per_rank_in_leader_mode(tmp_path):
    """tp 2: launch_triton_server.py's leader-mode form (get_cmd): mpirun, one tritonserver per rank
    with its own Python-backend shared-memory prefix, ranks > 0 loading only the dflash model, whose
    Executor runs in leader mode (no orchestrator environment, no spawned workers)."""
    from trtllm_dflash.launch.node_command import launch_command
    from trtllm_dflash.launch.server import Endpoints

    repo = tmp_path / "model_repository"
    cmd = launch_command(repo, Endpoints("0.0.0.0", 8000, 8001, 8002), 2, "dflash", llmapi=False)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(cmd[2:]).split(" : ")
    assert len(ranks) == 2 and all(r.startswith("-n 1 /opt/tritonserver/bin/tritonserver ") for r in ranks)
    for i, r in enumerate(ranks):
        assert f"--backend-config=python,shm-region-prefix-name=prefix{i}_" in r and f"--model-repository={repo}" in r
        assert "--model-control-mode=explicit" in r  # rank 0 can unload itself when a rank dies
        assert r.endswith("--load-model=dflash" if i > 0 else "--load-model=*")
    assert not any("ORCHESTRATOR" in a for a in cmd)
    command = launch_command(repo, Endpoints("0.0.0.0", 8000, 8001, 8002), 1, "dflash", llmapi=False)
    assert command[0].endswith("tritonserver")


def test_serve_prints_the_leader_mode_launch_whatever_the_launcher(tmp_path):
    """`serve` on an engine deployment at tp 2: one tritonserver per rank under one mpirun (leader
    mode; the Executor spawns no workers), for the single-node and the mpirun launcher alike."""
    recipe_path = ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"
    overrides = ["parallel.tp=2", "hardware.count=2"]
    recipe = load_recipe(recipe_path, overrides)
    with atomic_stage_dir(tmp_path / "build", Manifest.for_stage("build", recipe)) as d:
        (d / "x").write_bytes(b"stand-in")
    out = deploy(recipe, tmp_path / "build", tmp_path / "deploy")
    sets = [a for o in overrides for a in ("--set", o)]
    for launcher in ("single_node", "mpirun"):
        r = serve(*sets, "--from", out, "--launcher", launcher, recipe=recipe_path)
        cmd = shlex.split(r.stdout.strip())
        assert cmd[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"], r.stderr
        assert cmd.count("/opt/tritonserver/bin/tritonserver") == 2 and cmd.count(":") == 1
