"""`serve --launcher srun` writes a Slurm batch script and `--launcher k8s` a LeaderWorkerSet
manifest (launch/cluster.py, slurm.py, kubernetes.py): parsed back (the #SBATCH lines and the srun line with shlex; the
manifest with yaml.safe_load_all) and checked against the recipe's placement, for the 8-GPU B300
recipe (1 node x 8), the same recipe at tp 16 (2 nodes x 8), and single-GPU deployments (pytorch
at tp 1, and the engine backend). The shell around the commands runs here against stand-ins of
scontrol, srun, ssh and mpirun that record their arguments."""

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir
from trtllm_dflash.cli import main
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.launch.cluster_job import ClusterOptions, dns_label, source_checkout
from trtllm_dflash.launch.kubernetes import SSH_KEYS, SSH_PORT
from trtllm_dflash.launch.slurm import cpus_per_task, enroot_uri
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.containers import TRITON_TRTLLM_1_2, TRTLLM_RELEASE
from trtllm_dflash.recipe.plan.placement import Placement, placement
from trtllm_dflash.recipe.stages import input_stage

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"
QWEN_ENGINE = ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"
# name: (recipe, overrides)
CASES = {
    "one-node": (GPT_OSS, []),
    "two-nodes": (GPT_OSS, ["parallel.tp=16", "hardware.count=16"]),
    "one-gpu": (GPT_OSS, ["parallel.tp=1", "hardware.count=1"]),
    "engine": (QWEN_ENGINE, []),
    "replicas": (GPT_OSS, ["parallel.replicas=2", "hardware.count=16"]),  # two copies of one node each
    "wide-replicas": (GPT_OSS, ["parallel.tp=16", "parallel.replicas=2", "hardware.count=32"]),  # of two nodes each
}
REGISTRY = "registry.example"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """name -> deploy output, over stand-ins of the stage deploy reads (it reads manifests only)."""
    out = {}
    for name, (path, overrides) in CASES.items():
        root = tmp_path_factory.mktemp(name)
        recipe = load_recipe(path, overrides)
        stage = input_stage(recipe, "deploy")
        extra = {"layout": "hf"} if recipe.backend.name == "pytorch" else {}
        with atomic_stage_dir(root / stage, Manifest.for_stage(stage, recipe, extra=extra)) as d:
            (d / "weights.safetensors").write_bytes(b"stand-in")
        out[name] = deploy(recipe, root / stage, root / "deploy")
    return out


def serve(capsys, name: str, deployed, *args) -> tuple[int, str, str]:
    path, overrides = CASES[name]
    sets = [a for o in overrides for a in ("--set", o)]
    rc = main(["serve", str(path), *sets, "--from", str(deployed[name]), *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def written(out: str) -> Path:
    """The file serve reported writing; its submit line names the same file."""
    lines = out.strip().splitlines()
    path = Path(lines[0].removeprefix("wrote "))
    assert lines[1].startswith("submit: ") and shlex.split(lines[1])[-1] == str(path)
    return path


def parse_sbatch(text: str) -> tuple[dict, list[str]]:
    """(#SBATCH options, the argv of the srun step that serves a model copy) of a batch script."""
    directives = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH ").partition("=")
            directives[key] = value
    start = text.index("\n  srun ") + 1
    srun = text[start:text.index("\n}", start)].replace("\\\n", " ")
    return directives, shlex.split(srun)


def flag(argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(f"{name}="))


def rank(argv: list[str]) -> list[str]:
    """The srun line's command: what follows its own --flags."""
    return argv[next(i for i, a in enumerate(argv[1:], 1) if not a.startswith("--")):]


def after_prelude(cmd: list[str]) -> tuple[str, list[str]]:
    """(the shell run first, the command it then execs) of a `bash -c '...; exec CMD'` line (the
    pytorch backend behind Triton copies TensorRT-LLM's model.py first: launch/llmapi_model.py)."""
    assert cmd[:2] == ["bash", "-c"]
    prelude, _, command = cmd[2].rpartition("; exec ")
    return prelude, shlex.split(command)


def test_sbatch_one_node_x_8_runs_every_rank_under_trtllm_llmapi_launch(capsys, deployed):
    rc, out, err = serve(capsys, "one-node", deployed, "--launcher", "srun", "--api", "openai", "--registry", REGISTRY)
    assert rc == 0, err
    path = written(out)
    assert path.parent == deployed["one-node"] / "launch" and path.suffix == ".sbatch"
    sbatch, srun = parse_sbatch(path.read_text())
    assert (sbatch["--nodes"], sbatch["--ntasks-per-node"], sbatch["--gpus-per-node"]) == ("1", "8", "8")
    assert "--exclusive" in sbatch and not {"--partition", "--account", "--time"} & set(sbatch)
    recipe = load_recipe(GPT_OSS)
    assert flag(srun, "--container-image") == f"{REGISTRY}#{TRTLLM_RELEASE}:{recipe.backend.trtllm_version}"
    assert "--mpi=pmix" in srun and "--gpu-bind=none" in srun
    manifest = Manifest.read(deployed["one-node"])
    mounts = flag(srun, "--container-mounts").split(",")
    for p in (deployed["one-node"].resolve(), manifest.input_dir(deployed["one-node"])):
        assert f"{p}:{p}:ro" in mounts
    assert flag(srun, "--container-workdir") == str(deployed["one-node"].resolve())
    cmd = rank(srun)
    assert cmd[:2] == ["trtllm-llmapi-launch", "trtllm-serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == str(recipe.serve.http_port)
    assert cmd[cmd.index("--config") + 1] == str(
        deployed["one-node"].resolve() / "trtllm_serve/extra_llm_api_options.yaml")


def test_sbatch_two_nodes_with_the_users_partition_account_time_and_image(capsys, deployed):
    image = "registry.example/team/triton-llmapi:26.09"
    rc, out, err = serve(capsys, "two-nodes", deployed, "--launcher", "srun", "--image", image, "--partition",
                         "batch", "--account", "llm", "--time", "02:00:00", "--out", deployed["two-nodes"] / "job.sh")
    assert rc == 0, err
    path = written(out)
    assert path == deployed["two-nodes"] / "job.sh"
    sbatch, srun = parse_sbatch(path.read_text())
    where = placement(load_recipe(GPT_OSS, CASES["two-nodes"][1]))
    assert (where.nodes, where.tasks_per_node) == (2, 8)
    assert (sbatch["--nodes"], sbatch["--ntasks-per-node"], sbatch["--gpus-per-node"]) == ("2", "8", "8")
    assert (sbatch["--partition"], sbatch["--account"], sbatch["--time"]) == ("batch", "llm", "02:00:00")
    # A Docker-style reference becomes enroot's REGISTRY#IMAGE (Pyxis would look on Docker Hub otherwise).
    assert flag(srun, "--container-image") == "registry.example#team/triton-llmapi:26.09"
    prelude, cmd = after_prelude(rank(srun))
    assert "TRTLLM_LLMAPI_MODEL_DIR" in prelude and "OMPI_COMM_WORLD_RANK" in prelude  # the clearing model.py refused
    assert cmd[:2] == ["trtllm-llmapi-launch", "/opt/tritonserver/bin/tritonserver"]
    assert f"--model-repository={deployed['two-nodes'].resolve() / 'model_repository'}" in cmd
    d = deployed["two-nodes"].resolve()
    assert f"{d}:{d}" in flag(srun, "--container-mounts").split(",")  # model.py is copied into it
    assert "--http-address=0.0.0.0" in cmd and "--disable-auto-complete-config" in cmd


def test_sbatch_single_gpu_is_one_task_without_an_mpi_world(capsys, deployed):
    rc, out, err = serve(capsys, "one-gpu", deployed, "--launcher", "srun", "--api", "openai", "--registry", REGISTRY)
    assert rc == 0, err
    sbatch, srun = parse_sbatch(written(out).read_text())
    assert (sbatch["--nodes"], sbatch["--ntasks-per-node"], sbatch["--gpus-per-node"]) == ("1", "1", "1")
    assert "--exclusive" not in sbatch  # one GPU shares its node
    assert "--mpi=none" in srun and rank(srun)[0] == "trtllm-serve"


def test_sbatch_asks_for_cpus_per_gpu_on_the_job_and_its_step(capsys, deployed):
    """--cpus-per-gpu N: --cpus-per-task on the job and again on the step (Slurm 22.05 on: srun
    does not inherit it), N for each GPU a task drives (the engine's one task: all of its node's).
    Without it, a copy that shares its node says what its tasks get."""
    rc, out, err = serve(capsys, "one-gpu", deployed, "--launcher", "srun", "--api", "openai")
    text = written(out).read_text()
    sbatch, srun = parse_sbatch(text)
    assert "--cpus-per-task" not in sbatch and not any(a.startswith("--cpus-per-task") for a in srun)
    assert "# CPUs: this copy shares its node" in text and "serve --cpus-per-gpu N" in text
    rc, out, err = serve(capsys, "one-gpu", deployed, "--launcher", "srun", "--api", "openai", "--cpus-per-gpu", 8)
    text = written(out).read_text()
    sbatch, srun = parse_sbatch(text)
    assert sbatch["--cpus-per-task"] == "8" and "--cpus-per-task=8" in srun and "# CPUs:" not in text
    rc, out, err = serve(capsys, "engine", deployed, "--launcher", "srun", "--registry", REGISTRY, "--cpus-per-gpu", 4)
    sbatch, srun = parse_sbatch(written(out).read_text())
    assert (sbatch["--ntasks-per-node"], sbatch["--gpus-per-node"], sbatch["--cpus-per-task"]) == ("1", "1", "4")
    assert "--cpus-per-task=4" in srun
    # the engine's one task per node drives all of its GPUs (mpirun of tp servers inside it); a pytorch rank one
    engine_tp8 = SimpleNamespace(where=Placement(nodes=1, tasks_per_node=1, gpus_per_node=8, node_gpus=16, replicas=1))
    ranks_tp8 = SimpleNamespace(where=Placement(nodes=1, tasks_per_node=8, gpus_per_node=8, node_gpus=16, replicas=1))
    assert cpus_per_task(engine_tp8, ClusterOptions(cpus_per_gpu=4)) == ["--cpus-per-task=32"]
    assert cpus_per_task(ranks_tp8, ClusterOptions(cpus_per_gpu=4)) == ["--cpus-per-task=4"]
    rc, out, err = serve(capsys, "one-node", deployed, "--launcher", "srun", "--api", "openai", "--cpus-per-gpu", 4)
    text = written(out).read_text()  # a whole node (--exclusive): every CPU of it, not cut down by srun -c
    assert "# CPUs:" not in text and "--cpus-per-task" not in text
    with pytest.raises(SystemExit) as bad:
        serve(capsys, "one-gpu", deployed, "--launcher", "srun", "--cpus-per-gpu", "0")
    assert bad.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "argument --cpus-per-gpu: expected a positive whole number, got '0'")


def test_sbatch_engine_installs_this_checkout_into_nvidias_triton_image(capsys, deployed):
    rc, out, err = serve(capsys, "engine", deployed, "--launcher", "srun", "--registry", REGISTRY)
    assert rc == 0, err
    sbatch, srun = parse_sbatch(written(out).read_text())
    assert (sbatch["--nodes"], sbatch["--ntasks-per-node"], sbatch["--gpus-per-node"]) == ("1", "1", "1")
    assert flag(srun, "--container-image") == f"{REGISTRY}#{TRITON_TRTLLM_1_2}"
    src = source_checkout()
    assert src is not None and f"{src}:{src}" in flag(srun, "--container-mounts").split(",")
    # Pyxis starts a read-only container unless asked: the install writes into the image's environment
    assert "--container-writable" in srun and "--container-remap-root" in srun
    cmd = rank(srun)
    assert cmd[:2] == ["bash", "-c"]
    install, _, server = cmd[2].partition(" && exec ")
    assert shlex.split(install)[-2:] == ["-e", str(src)] and "--no-deps" in install
    assert shlex.split(server)[0] == "/opt/tritonserver/bin/tritonserver"


def test_nvidias_registry_is_the_default_for_both_launchers(capsys, deployed):
    """No --registry: NVIDIA's images on nvcr.io, as enroot's `nvcr.io#nvidia/...` for Pyxis and as
    `nvcr.io/nvidia/...` in the pods; --registry names a mirror instead (the tests above)."""
    version = load_recipe(GPT_OSS).backend.trtllm_version
    rc, out, err = serve(capsys, "one-node", deployed, "--launcher", "srun", "--api", "openai")
    assert rc == 0, err
    _, srun = parse_sbatch(written(out).read_text())
    assert flag(srun, "--container-image") == f"nvcr.io#nvidia/tensorrt-llm/release:{version}"
    rc, out, err = serve(capsys, "engine", deployed, "--launcher", "srun")
    assert rc == 0, err
    assert flag(parse_sbatch(written(out).read_text())[1], "--container-image") == f"nvcr.io#{TRITON_TRTLLM_1_2}"
    assert TRITON_TRTLLM_1_2.startswith("nvidia/tritonserver:")
    (set_, _) = lws(capsys, "one-node", deployed, "--api", "openai")
    image = containers(set_["spec"]["leaderWorkerTemplate"]["workerTemplate"])["image"]
    assert image == f"nvcr.io/nvidia/tensorrt-llm/release:{version}"


def test_sbatch_runs_as_written(capsys, deployed, tmp_path):
    """bash runs the script: scontrol and srun are stand-ins that record what they are given."""
    rc, out, err = serve(capsys, "two-nodes", deployed, "--launcher", "srun", "--image", "img:1")
    assert rc == 0, err
    path = written(out)
    log = stub_tools(tmp_path, {"scontrol": "echo node-a; echo node-b", "srun": 'printf "%s\\n" "$@" > "$LOG"'})
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]", "LOG": log}
    r = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "copy 0 (rank 0 on node-a) serves http://node-a:8000" in r.stdout
    step = [a.replace("$nodes", "node-a,node-b") for a in parse_sbatch(path.read_text())[1][1:]]
    assert Path(log).read_text().splitlines() == step


def run_sbatch(path: Path, tmp_path: Path, nodes: list[str], srun: str) -> tuple[subprocess.CompletedProcess, list]:
    """Run the batch script on stand-ins of scontrol (the job's nodes) and srun (`srun`: its body);
    return the run and every srun call's arguments."""
    calls = tmp_path / "calls"
    calls.mkdir(parents=True)
    stub_tools(tmp_path, {"scontrol": f"printf '%s\\n' {' '.join(nodes)}",
                          "srun": f'printf "%s\\n" "$@" > "$(mktemp -p {calls})"\n{srun}'})
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "stand-in"}
    r = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)
    return r, [p.read_text().splitlines() for p in calls.iterdir()]


@pytest.mark.parametrize("name, per_copy", [("replicas", 1), ("wide-replicas", 2)])
def test_sbatch_starts_every_replica_on_nodes_of_its_own_and_prints_each_endpoint(capsys, deployed, tmp_path, name,
                                                                                   per_copy):
    rc, out, err = serve(capsys, name, deployed, "--launcher", "srun", "--api", "openai")
    assert rc == 0, err
    path = written(out)
    sbatch, srun = parse_sbatch(path.read_text())
    assert (sbatch["--nodes"], sbatch["--ntasks-per-node"]) == (str(2 * per_copy), "8")
    assert (flag(srun, "--nodes"), flag(srun, "--ntasks-per-node")) == (str(per_copy), "8")
    assert "sweep --url` at each" in path.read_text()  # how to put one endpoint in front
    nodes = [f"node-{i}" for i in range(2 * per_copy)]
    r, calls = run_sbatch(path, tmp_path, nodes, "exit 0")
    assert r.returncode == 0, r.stderr
    used = sorted(flag(c, "--nodelist") for c in calls if any(a.startswith("--container-image") for a in c))
    assert used == sorted(",".join(nodes[i:i + per_copy]) for i in range(0, len(nodes), per_copy))
    for first in nodes[::per_copy]:
        assert f"serves http://{first}:8000" in r.stdout


def test_sbatch_fails_when_a_replica_fails(capsys, deployed, tmp_path):
    rc, out, err = serve(capsys, "replicas", deployed, "--launcher", "srun", "--api", "openai")
    assert rc == 0, err
    r, _ = run_sbatch(written(out), tmp_path, ["node-0", "node-1"],
                      'for a in "$@"; do [ "$a" = --nodelist=node-1 ] && exit 3; done; exit 0')
    assert r.returncode == 3


def test_sbatch_checks_every_node_sees_every_mount_before_any_server_starts(capsys, deployed, tmp_path):
    """The stand-in srun runs the storage check itself (here every "node" is this machine): with
    every mounted directory present the copies start; with one gone the job stops naming it, and
    no server step runs."""
    model = tmp_path / "llmapi"
    (model / "1").mkdir(parents=True)
    for f in ("model.py", "helpers.py"):
        (model / "1" / f).write_text("")
    rc, out, err = serve(capsys, "replicas", deployed, "--launcher", "srun", "--image", "i:1", "--llmapi-model", model)
    assert rc == 0, err
    note = out.splitlines()[2]
    assert note.startswith("shared storage: every path the job mounts (") and str(model) in note
    text = written(out).read_text()
    assert "# Shared storage: every path the job mounts" in text and "must be on storage every node sees" in text
    check = 'for a in "$@"; do [ "$a" = --ntasks-per-node=1 ] && exec "${@: -3}"; done; exit 0'
    r, calls = run_sbatch(written(out), tmp_path / "ok", ["node-0", "node-1"], check)
    assert r.returncode == 0, r.stderr
    (step,) = [c for c in calls if "--ntasks-per-node=1" in c]
    assert step[:2] == ["--nodes=2", "--ntasks-per-node=1"] and step[2] == "bash"
    assert len([c for c in calls if any(a.startswith("--container-image") for a in c)]) == 2
    shutil.rmtree(model)
    r, calls = run_sbatch(written(out), tmp_path / "gone", ["node-0", "node-1"], check)
    assert r.returncode == 1 and f"does not see {model}: every path the job mounts must be on storage" in r.stderr
    assert not [c for c in calls if any(a.startswith("--container-image") for a in c)]


@pytest.mark.parametrize("name, args, mode", [
    # trtllm-serve writes its per-request metrics under the deploy output's trtllm_serve/ (the sweep reads them)
    ("one-gpu", ["--api", "openai"], "ReadWriteOnce or ReadWriteMany (the pods write there)"),
    ("replicas", ["--api", "openai"], "ReadWriteMany (the pods write there)"),
    ("two-nodes", ["--image", "i:1"], "ReadWriteMany (the pods write there)"),  # model.py is copied in
])
def test_lws_states_what_its_claim_must_be(capsys, deployed, name, args, mode):
    rc, out, err = serve(capsys, name, deployed, "--launcher", "k8s", *args)
    assert rc == 0, err
    assert out.splitlines()[2].startswith("shared storage: the claim ") and out.splitlines()[2].endswith(mode)
    text = written(out).read_text()
    set_ = next(yaml.safe_load_all(text))
    note = set_["metadata"]["annotations"]["trtllm-dflash/shared-storage"]
    assert "on storage every node sees" in note and note.endswith(mode) and f"# Shared storage: {note}." in text


def test_lws_replicas_are_groups_behind_the_one_service(capsys, deployed):
    (set_, service) = lws(capsys, "wide-replicas", deployed, "--api", "openai")
    assert set_["spec"]["replicas"] == 2 and set_["spec"]["leaderWorkerTemplate"]["size"] == 2
    # The Service selects every group's leader (worker index 0), so it balances over the copies.
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": set_["metadata"]["name"],
                                           "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    (set_, _) = lws(capsys, "replicas", deployed, "--api", "openai")
    assert set_["spec"]["replicas"] == 2 and set_["spec"]["leaderWorkerTemplate"]["size"] == 1


def stub_tools(directory: Path, scripts: dict[str, str]) -> str:
    for name, body in scripts.items():
        tool = directory / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return str(directory / "calls.log")


def lws(capsys, name: str, deployed, *args) -> list[dict]:
    rc, out, err = serve(capsys, name, deployed, "--launcher", "k8s", *args)
    assert rc == 0, err
    path = written(out)
    assert path.name.endswith("-lws.yaml")
    return list(yaml.safe_load_all(path.read_text()))


def containers(pod: dict) -> dict:
    (container,) = pod["spec"]["containers"]
    return container


def test_lws_two_nodes_leader_serves_workers_join(capsys, deployed):
    image = "registry.example/team/triton-llmapi:26.09"
    docs = lws(capsys, "two-nodes", deployed, "--image", image, "--pvc", "models")
    set_, service = docs
    assert (set_["apiVersion"], set_["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    name = set_["metadata"]["name"]
    assert name == dns_label("b300x8-gpt-oss-120b-nvfp4") == "b300x8-gpt-oss-120b-nvfp4"
    spec = set_["spec"]
    assert spec["startupPolicy"] == "LeaderCreated" and spec["replicas"] == 1
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = containers(template["leaderTemplate"]), containers(template["workerTemplate"])
    for c in (leader, worker):
        assert c["image"] == image and c["resources"]["limits"]["nvidia.com/gpu"] == 8
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["dshm"]["mountPath"] == "/dev/shm" and mounts["mpi-ssh"]["mountPath"] == SSH_KEYS
        assert mounts["runs"]["mountPath"] == str(deployed["two-nodes"].resolve().parent)
    volumes = {v["name"]: v for v in template["leaderTemplate"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == "models"
    assert volumes["mpi-ssh"]["secret"]["secretName"] == f"{name}-mpi-ssh"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # liveness restarts a group whose rank died
        assert leader[probe]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert leader["startupProbe"]["failureThreshold"] * leader["startupProbe"]["periodSeconds"] >= 1800  # loading
    assert {p["name"]: p["containerPort"] for p in leader["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(worker)
    assert f"-p {SSH_PORT}" in worker["command"][2] and "sshd" in worker["command"][2]
    assert (service["kind"], service["metadata"]["name"]) == ("Service", f"{name}-api")
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": name,
                                           "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (8000, "http"), (8001, "grpc"), (8002, "metrics")]


def test_lws_leader_script_starts_16_ranks_on_both_pods(capsys, deployed, tmp_path):
    """The leader's script runs here: LWS's variables set as its webhook sets them, ssh and mpirun
    stand-ins, the image's LLM-API model a model.py that keeps the MPI environment; mpirun gets 16
    ranks, 8 slots on the leader then 8 on worker 1, and rank 0 serves."""
    (set_, _) = lws(capsys, "two-nodes", deployed, "--image", "img:1")
    script = containers(set_["spec"]["leaderWorkerTemplate"]["leaderTemplate"])["command"][2]
    log = stub_tools(tmp_path, {"ssh": "exit 0", "mpirun": 'printf "%s\\n" "$@" > "$LOG"'})
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("stand-in key\n")
    model = tmp_path / "llmapi" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("import os\nRANK = os.environ.get('OMPI_COMM_WORLD_RANK')\n")
    (model / "helpers.py").write_text("")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "HOME": str(tmp_path / "home"), "LOG": log,
           "LWS_LEADER_ADDRESS": "dflash-0.dflash.ns", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0",
           "TRTLLM_LLMAPI_MODEL_DIR": str(model.parent)}
    r = subprocess.run(["bash", "-c", script.replace(SSH_KEYS, str(keys))], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    version = deployed["two-nodes"] / "model_repository" / "dflash" / "1"
    assert (version / "model.py").read_text() == (model / "model.py").read_text() and (version / "helpers.py").exists()
    argv = Path(log).read_text().splitlines()
    assert argv[argv.index("-np") + 1] == "16"
    assert argv[argv.index("-H") + 1] == "dflash-0.dflash.ns:8,dflash-0-1.dflash.ns:8"
    assert f"-p {SSH_PORT}" in argv[argv.index("plm_rsh_args") + 1]
    assert argv[argv.index("trtllm-llmapi-launch") + 1] == "/opt/tritonserver/bin/tritonserver"


def test_lws_one_node_and_one_gpu_are_a_group_of_one(capsys, deployed):
    (set_, service) = lws(capsys, "one-node", deployed, "--api", "openai", "--registry", REGISTRY)
    template = set_["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 1 and "leaderTemplate" not in template  # LWS uses the worker template for the leader
    server = containers(template["workerTemplate"])
    assert server["command"][:5] == ["mpirun", "--allow-run-as-root", "-n", "8", "trtllm-llmapi-launch"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"  # trtllm-serve's
    assert not any(v["name"] == "mpi-ssh" for v in template["workerTemplate"]["spec"]["volumes"])
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
    (set_, _) = lws(capsys, "one-gpu", deployed, "--api", "openai", "--registry", REGISTRY)
    server = containers(set_["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    assert server["command"][0] == "trtllm-serve" and server["resources"]["limits"]["nvidia.com/gpu"] == 1


@pytest.mark.parametrize("name", ["two-nodes", "wide-replicas"])
def test_manifest_pods_and_service_pass_kubernetes_strict_schemas(capsys, deployed, name):
    """Every pod template (as a core PodTemplate) and the Service validate against Kubernetes'
    own JSON schemas with unknown fields refused (kubernetes-validate, 1.32)."""
    kv = pytest.importorskip("kubernetes_validate")
    (set_, service) = lws(capsys, name, deployed, "--image", "img:1")
    template = set_["spec"]["leaderWorkerTemplate"]
    for pod in (template["leaderTemplate"], template["workerTemplate"]):
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": pod}, "1.32.0",
                    strict=True)
    kv.validate(service, "1.32.0", strict=True)


def test_shell_in_the_pods_parses(capsys, deployed):
    (set_, _) = lws(capsys, "two-nodes", deployed, "--image", "img:1")
    template = set_["spec"]["leaderWorkerTemplate"]
    for pod in (template["leaderTemplate"], template["workerTemplate"]):
        command = containers(pod)["command"]
        assert command[:2] == ["/bin/bash", "-c"]
        r = subprocess.run(["bash", "-n", "-c", command[2]], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, message", [
    (("--launcher", "srun"), "--image: no published Triton image carries TensorRT-LLM >= 1.3"),
    (("--launcher", "srun", "--api", "openai", "--registry", ""),
     "--registry: empty; nvidia/tensorrt-llm/release:"),
    (("--launcher", "k8s", "--image", "i:1", "--container", "x:1"), "--container: docker run is for one node"),
])
def test_what_a_launcher_needs_is_asked_for_in_one_line(capsys, deployed, args, message):
    rc, _, err = serve(capsys, "one-node", deployed, *args)
    assert rc == 2 and err.count("\n") == 1 and message in err


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="submits for real where Slurm is installed")
def test_run_submits_only_where_the_schedulers_tool_is(capsys, deployed):
    rc, out, err = serve(capsys, "one-gpu", deployed, "--launcher", "srun", "--api", "openai", "--registry", REGISTRY,
                         "--run")
    assert rc == 2 and out.startswith("wrote ") and "sbatch: not found on PATH; run `sbatch " in err


def test_a_world_no_node_layout_expresses_is_refused(tmp_path):
    """12 ranks on 8-GPU nodes: one node cannot hold them and two would hold 6 each, which
    TensorRT-LLM's global_rank % device_count GPU choice does not allow. check refuses the recipe;
    a launcher handed it anyway (rules skipped) refuses it in one line too."""
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.recipe.schema import RecipeError

    overrides = ["parallel.tp=12", "hardware.count=16"]
    with pytest.raises(RecipeError, match="parallel.tp: tp\\*pp = 12 ranks span nodes of 8 b300"):
        load_recipe(GPT_OSS, overrides)
    with pytest.raises(UserError, match="^parallel.tp: tp\\*pp = 12 ranks span nodes of 8 b300[^\n]*$"):
        placement(load_recipe(GPT_OSS, overrides, check_rules=False))
    with pytest.raises(RecipeError, match="hardware.count: 12 b300 span nodes of 8: use whole nodes"):
        load_recipe(GPT_OSS, ["hardware.count=12"])
    with pytest.raises(RecipeError, match="only the pytorch backend spans nodes; the engine backend runs on one node"):
        load_recipe(QWEN_ENGINE, ["hardware.count=16"])


def test_reference_backend_has_no_cluster_placement():
    from trtllm_dflash.errors import UserError

    with pytest.raises(UserError, match="the reference backend serves from this machine"):
        placement(load_recipe(ROOT / "recipes/cpu/tiny-pystd.yaml"))


def test_enroot_uri_follows_dockers_registry_rule():
    assert enroot_uri("nvidia/tritonserver:26.07") == "nvidia/tritonserver:26.07"  # Docker Hub path: as is
    assert enroot_uri("host.example/nvidia/x:1") == "host.example#nvidia/x:1"
    assert enroot_uri("localhost:5000/x:1") == "localhost:5000#x:1"
    assert enroot_uri("host.example#nvidia/x:1") == "host.example#nvidia/x:1"


def test_dns_label_from_recipe_names():
    assert dns_label("H100_Qwen3.8B") == "h100-qwen3-8b"
    assert dns_label("8b-test") == "dflash-8b-test"
    assert len(dns_label("x" * 80)) == 40


def test_run_stops_before_a_multi_node_serve_with_the_launcher_to_write():
    from trtllm_dflash.serve.stage import where

    one = where(load_recipe(GPT_OSS), Path("runs/x"), "R")
    two = where(load_recipe(GPT_OSS, CASES["two-nodes"][1]), Path("runs/x"), "R")
    assert "serves on 8x b300" in one and "--run --api openai" in one
    assert "serves on 2 nodes of 8x b300" in two and "--launcher srun` (or `--launcher k8s`)" in two
    assert "--run" not in two
    copies = where(load_recipe(GPT_OSS, CASES["replicas"][1]), Path("runs/x"), "R")
    assert "serves 2 copies (parallel.replicas), each on 8x b300" in copies and "--launcher srun" in copies


def test_replicas_scale_a_copy_that_fits_one_node_and_check_says_when_tp_spans_nodes_needlessly():
    from trtllm_dflash.recipe.rules import check
    from trtllm_dflash.recipe.schema import RecipeError

    engine = load_recipe(QWEN_ENGINE, ["parallel.tp=8", "parallel.replicas=2", "hardware.count=16"])
    assert placement(engine) == placement(engine).__class__(nodes=1, tasks_per_node=1, gpus_per_node=8, node_gpus=8,
                                                            replicas=2)
    with pytest.raises(RecipeError, match="only the pytorch backend spans nodes"):
        load_recipe(QWEN_ENGINE, ["parallel.tp=16", "hardware.count=16"])
    two = load_recipe(GPT_OSS, ["parallel.replicas=2", "hardware.count=16"])
    assert (placement(two).nodes, placement(two).replicas) == (1, 2)
    assert not [i for i in check(two) if i.field in ("parallel.tp", "hardware.count")]
    wide = [i.message for i in check(load_recipe(GPT_OSS, ["parallel.tp=16", "hardware.count=16"]))
            if i.field == "parallel.tp" and "NVLink" in i.message]
    assert wide == ["1 replica(s) of tp 16: tp 16 spans 2 NVLink domains of 8 b300, its all-reduces cross the "
                    "inter-node fabric, though one copy fits one domain (from tp 1): parallel.tp 8 with "
                    "parallel.replicas 2 keeps them on NVLink"]
    idle = [i.message for i in check(load_recipe(GPT_OSS, ["hardware.count=16"])) if i.field == "hardware.count"]
    assert idle == ["16 GPUs, 8 used (tp*pp 8 x parallel.replicas 1); more replicas would use the rest"]
    with pytest.raises(RecipeError, match=r"parallel.tp: tp\*pp = 8 x parallel.replicas 3 = 24 > hardware.count 16"):
        load_recipe(GPT_OSS, ["parallel.replicas=3", "hardware.count=16"])
