"""`serve --api dynamo` on the pytorch backend (commands/serve_dynamo.py, launch/dynamo*.py): the
one-node script, the Slurm batch script and the DynamoGraphDeployment, parsed back and checked
against the recipe and against upstream's facts (recipe/dynamo.py): every dynamo.trtllm /
dynamo.frontend flag parses with a parser built from the pinned release's flags, the manifest
validates against the CRD's v1beta1 schema (recipe/catalog/dgd-v1beta1.schema.json) with its pod
templates and ConfigMap against Kubernetes' own schemas (kubernetes-validate), and it has the shape
of the ai-dynamo 1.6.1 wheel's own agg.yaml template. The shell scripts run here against stand-ins
of python3, scontrol, srun and hostname that record their arguments."""

import argparse
import copy
import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir
from trtllm_dflash.cli import main
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.recipe import dynamo, images, load_recipe
from trtllm_dflash.recipe.stages import input_stage
from trtllm_dflash.recipe.trtllm_api import PINNED

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"
QWEN = ROOT / "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"
CASES = {
    "one-node": (GPT_OSS, []),  # one worker of tp 8
    "replicas": (GPT_OSS, ["parallel.tp=4", "parallel.replicas=2"]),  # two workers on one node
    "wide-replicas": (GPT_OSS, ["parallel.tp=16", "parallel.replicas=2", "hardware.count=32"]),  # 2 x 2 nodes
    "kv": (QWEN, ["backend.trtllm_version=1.4.0rc1"]),  # prefix reuse on: the KV router
}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """name -> deploy output, over stand-ins of the stage deploy reads (it reads manifests only)."""
    out = {}
    for name, (path, overrides) in CASES.items():
        root = tmp_path_factory.mktemp(name)
        recipe = load_recipe(path, overrides)
        stage = input_stage(recipe, "deploy")
        with atomic_stage_dir(root / stage, Manifest.for_stage(stage, recipe, extra={"layout": "hf"})) as d:
            (d / "weights.safetensors").write_bytes(b"stand-in")
        out[name] = deploy(recipe, root / stage, root / "deploy")
    return out


def serve(capsys, name, deployed, *args) -> tuple[int, str, str]:
    path, overrides = CASES[name]
    sets = [a for o in overrides for a in ("--set", o)]
    rc = main(["serve", str(path), *sets, "--from", str(deployed[name]), "--api", "dynamo", *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def processes(script: str) -> list[list[str]]:
    """The commands of the one-node script, each split as the shell would (the `&` dropped)."""
    return [shlex.split(line.removesuffix(" &")) for line in script.splitlines() if line.endswith(" &")]


def dynamo_args(cmd: list[str]) -> tuple[str, list[str]]:
    """(process, its arguments) of a command ending in `python3 -m dynamo.X ARGS`."""
    i = cmd.index("-m")
    process = {v: k for k, v in dynamo.PROCESSES.items()}[cmd[i + 1]]
    return process, cmd[i + 2:]


def upstream_parser(process: str) -> argparse.ArgumentParser:
    """A parser of the pinned release's flags we write (types, choices, booleans): our arguments
    must parse with it, unknown flags refused."""
    p = argparse.ArgumentParser(exit_on_error=False)
    for name, spec in dynamo.flags(process).items():
        names = [name, *[a for a in spec.get("aliases", []) if not a.startswith("--no-")]]
        if spec["type"] == "bool":
            p.add_argument(*names, dest=spec["dest"], action=argparse.BooleanOptionalAction)
        else:
            p.add_argument(*names, dest=spec["dest"], type={"int": int, "str": str}[spec["type"]],
                           choices=spec.get("choices"))
    return p


def parses(process: str, argv: list[str]) -> argparse.Namespace:
    ns, unknown = upstream_parser(process).parse_known_args(argv)
    assert not unknown, f"{dynamo.PROCESSES[process]} {dynamo.version()} has no {unknown}"
    return ns


def stub_tools(directory: Path, scripts: dict[str, str]) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        tool = directory / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}


# One node --------------------------------------------------------------------------------------

def test_one_node_script_runs_the_frontend_and_each_replica_on_gpus_of_its_own(capsys, deployed):
    rc, out, err = serve(capsys, "replicas", deployed)
    assert rc == 0, err
    assert subprocess.run(["bash", "-n", "-c", out], capture_output=True, timeout=30).returncode == 0
    frontend, *workers = processes(out)
    assert dynamo_args(frontend)[0] == "frontend" and len(workers) == 2
    ns = parses("frontend", dynamo_args(frontend)[1])
    assert (ns.http_host, ns.http_port, ns.router_mode, ns.discovery_backend) == ("127.0.0.1", 8000, "round-robin",
                                                                                  "file")
    seen = []
    for worker in workers:
        env = dict(a.split("=", 1) for a in worker[1:worker.index("python3")])
        seen.append((env["CUDA_VISIBLE_DEVICES"], env["DYN_SYSTEM_PORT"]))
        w = parses("worker", dynamo_args(worker)[1])
        assert (w.tensor_parallel_size, w.discovery_backend, w.disaggregation_mode) == (4, "file", "agg")
        assert w.publish_metrics and not w.publish_kv_events  # reuse is off on 1.3: nothing to route on
        assert w.extra_engine_args == str(deployed["replicas"] / "dynamo/engine_args.yaml")
    assert seen == [("0,1,2,3", "8002"), ("4,5,6,7", "8003")]
    assert "router round-robin" in out.splitlines()[0] and "recompute tail" in out.splitlines()[0]


def test_mpirun_runs_each_worker_as_one_world_under_trtllm_llmapi_launch(capsys, deployed):
    rc, out, err = serve(capsys, "one-node", deployed, "--launcher", "mpirun")
    assert rc == 0, err
    (_, worker) = processes(out)
    i = worker.index("mpirun")
    assert worker[i:i + 4] == ["mpirun", "--allow-run-as-root", "-n", "8"]
    assert worker[worker.index("trtllm-llmapi-launch") + 1:][:3] == ["python3", "-m", "dynamo.trtllm"]


def test_the_script_runs_as_written_and_stops_every_process_when_one_ends(capsys, deployed, tmp_path, monkeypatch):
    """--run, with a stand-in python3 that records its arguments: the workers serve on, the
    frontend ends (code 5) once all three have started; the script ends with its code and stops
    the workers."""
    log, pids = tmp_path / "log", tmp_path / "pids"
    body = (f'echo "$*" >> {log}\n'
            f'case "$2" in *importlib.metadata*) echo {PINNED}; exit 0;; esac\n'
            f'if [ "$2" = dynamo.trtllm ]; then echo $$ >> {pids}; exec sleep 60; fi\n'
            f'if [ "$2" = dynamo.frontend ]; then while [ "$(wc -l < {log})" -lt 5 ]; do sleep 0.05; done; exit 5; fi\n'
            "exit 0")
    monkeypatch.setenv("PATH", stub_tools(tmp_path / "bin", {"python3": body})["PATH"])
    rc, out, err = serve(capsys, "replicas", deployed, "--run")
    assert rc == 5, err
    calls = log.read_text().splitlines()
    assert calls[0].startswith("-c import importlib.util")  # is dynamo.trtllm installed here?
    assert "importlib.metadata" in calls[1]  # and its TensorRT-LLM the recipe's?
    assert sorted(c.split()[1] for c in calls[2:]) == ["dynamo.frontend", "dynamo.trtllm", "dynamo.trtllm"]
    for pid in map(int, pids.read_text().split()):  # the script stopped both workers when the frontend ended
        with pytest.raises(ProcessLookupError):
            for _ in range(100):
                os.kill(pid, 0)
                __import__("time").sleep(0.05)


def test_run_refuses_a_tensorrt_llm_other_than_the_recipes(capsys, deployed, tmp_path, monkeypatch):
    body = 'case "$2" in *importlib.metadata*) echo 1.2.1;; esac; exit 0'
    monkeypatch.setenv("PATH", stub_tools(tmp_path / "bin", {"python3": body})["PATH"])
    rc, _, err = serve(capsys, "one-node", deployed, "--run")
    assert rc == 2 and f"backend.trtllm_version {PINNED}: this machine's TensorRT-LLM is 1.2.1" in err, err


def test_container_runs_the_whole_script_in_one_docker_run(capsys, deployed):
    rc, out, err = serve(capsys, "one-node", deployed, "--container",
                         "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1")
    assert rc == 0, err
    cmd = shlex.split(out)
    assert cmd[:2] == ["docker", "run"] and cmd[-3:-1] == ["bash", "-c"]
    assert f"{deployed['one-node']}:{deployed['one-node']}" in cmd
    assert [dynamo_args(p)[0] for p in processes(cmd[-1])] == ["frontend", "worker"]


@pytest.mark.parametrize("name, args, message", [
    ("wide-replicas", (), "do not fit one node of 8: --launcher srun (Slurm) or k8s"),
    ("one-node", ("--disaggregation-mode", "prefill"), "refused for DFlash: TensorRT-LLM #17264"),
    ("one-node", ("--disaggregation-mode", "decode", "--launcher", "k8s"), "refused for DFlash: TensorRT-LLM #17264"),
    ("kv", ("--launcher", "srun"), "1.4.0rc1: no NVIDIA Dynamo 1.6.1 tensorrtllm-runtime image carries it"),
    # One node too: the script runs in the pinned Dynamo's image, whose 1.3.0rc29 refuses 1.4's fields.
    ("kv", (), "backend.trtllm_version 1.4.0rc1: no NVIDIA Dynamo 1.6.1 tensorrtllm-runtime image"),
    ("one-node", ("--launcher", "k8s", "--container", "x:1"), "--container: docker run is for one node"),
])
def test_what_dynamo_cannot_do_is_one_line(capsys, deployed, name, args, message):
    rc, _, err = serve(capsys, name, deployed, *args)
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_disaggregation_mode_takes_dynamos_values_and_agg_serves(capsys, deployed):
    assert serve(capsys, "one-node", deployed, "--disaggregation-mode", "agg")[0] == 0
    with pytest.raises(SystemExit):  # the value Dynamo's own Slurm example sets, which 1.6.1 refuses
        serve(capsys, "one-node", deployed, "--disaggregation-mode", "prefill_and_decode")


def test_kv_router_where_prefix_reuse_is_on(capsys, deployed):
    rc, out, err = serve(capsys, "kv", deployed, "--container", "registry.example/dynamo-trtllm-1.4:1")
    assert rc == 0, err
    frontend, worker = processes(shlex.split(out)[-1])
    assert parses("frontend", dynamo_args(frontend)[1]).router_mode == "kv"
    assert parses("worker", dynamo_args(worker)[1]).publish_kv_events
    engine_args = yaml.safe_load((deployed["kv"] / "dynamo/engine_args.yaml").read_text())
    assert engine_args["kv_cache_config"]["enable_block_reuse"] is True


def test_a_flag_outside_the_pinned_release_is_caught():
    """The check every command goes through, and the test's own parser, both refuse what 1.6.1
    lacks (the deprecated combined flag; a mode it dropped)."""
    with pytest.raises(AssertionError, match="not a flag we know"):
        dynamo.checked("worker", ["--publish-events-and-metrics"])
    with pytest.raises(AssertionError, match="not one of"):
        dynamo.checked("worker", ["--disaggregation-mode", "prefill_and_decode"])
    with pytest.raises(AssertionError, match="has no"):
        parses("frontend", ["--enforce-disagg"])


# Slurm -----------------------------------------------------------------------------------------

def written(out: str) -> Path:
    lines = out.strip().splitlines()
    path = Path(lines[0].removeprefix("wrote "))
    assert lines[1].startswith("submit: ") and shlex.split(lines[1])[-1] == str(path)
    return path


def run_sbatch(path: Path, tmp_path: Path, nodes: list[str], srun: str = "exit 0", ip: str = "10.0.0.1"):
    calls = tmp_path / "calls"
    calls.mkdir(parents=True)
    env = stub_tools(tmp_path / "bin", {"scontrol": f"printf '%s\\n' {' '.join(nodes)}", "hostname": f"echo {ip}",
                                         "srun": f'printf "%s\\n" "$@" > "$(mktemp -p {calls})"\n{srun}'})
    r = subprocess.run(["bash", str(path)], env={**env, "SLURM_JOB_NODELIST": "x", "SLURM_JOB_ID": "7"},
                       capture_output=True, text=True, timeout=30)
    return r, [p.read_text().splitlines() for p in calls.iterdir()]


def test_sbatch_runs_etcd_and_the_frontend_on_the_head_and_each_worker_as_one_pmix_world(capsys, deployed, tmp_path):
    rc, out, err = serve(capsys, "wide-replicas", deployed, "--launcher", "srun")
    assert rc == 0, err
    path = written(out)
    assert path.name.endswith("-dynamo.sbatch") and "router: round-robin" in out
    text = path.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=8" in text and "nats-server" not in text
    assert "No NATS" in text  # 1.6.1's event plane is ZMQ unless told otherwise
    nodes = [f"node-{i}" for i in range(4)]
    r, calls = run_sbatch(path, tmp_path, nodes)
    assert r.returncode == 0, r.stderr
    assert "Dynamo frontend on http://node-0:8000/v1" in r.stdout
    (front,) = [c for c in calls if "--overlap" in c and "--container-env=ETCD_ENDPOINTS" in c]
    # Workers start once etcd answers on the head node (a host step there, before any worker's).
    (wait,) = [c for c in calls if "--overlap" in c and c != front]
    assert "--nodelist=node-0" in wait and "/dev/tcp/127.0.0.1/2379" in wait[-1]
    assert "--nodelist=node-0" in front and "--container-env=ETCD_ENDPOINTS" in front
    mounts = next(a for a in front if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert all(m.endswith(":ro") for m in mounts)  # Dynamo's processes write nothing into the deployment
    services = front[-1]
    assert services.startswith("etcd --listen-client-urls http://0.0.0.0:2379")
    frontend = shlex.split(services.split("exec ", 1)[1])
    assert parses("frontend", dynamo_args(frontend)[1]).discovery_backend == "etcd"
    workers = [c for c in calls if "--mpi=pmix" in c]
    assert sorted(next(a for a in c if a.startswith("--nodelist=")) for c in workers) == \
        ["--nodelist=node-0,node-1", "--nodelist=node-2,node-3"]
    for c in workers:
        cmd = c[c.index("--gpu-bind=none") + 1:]
        assert cmd[0] == "trtllm-llmapi-launch" and "--ntasks-per-node=8" in c and "--nodes=2" in c
        w = parses("worker", dynamo_args(cmd)[1])
        assert (w.tensor_parallel_size, w.discovery_backend, w.disaggregation_mode) == (16, "etcd", "agg")


def test_sbatch_workers_ask_for_their_cpus(capsys, deployed, tmp_path):
    """--cpus-per-gpu, workers of tp 4 that share their nodes: the job's and every worker step's
    --cpus-per-task (one GPU a rank)."""
    rc, out, err = serve(capsys, "replicas", deployed, "--launcher", "srun", "--cpus-per-gpu", 6)
    assert rc == 0, err
    path = written(out)
    assert "#SBATCH --cpus-per-task=6" in path.read_text()
    r, calls = run_sbatch(path, tmp_path, [f"node-{i}" for i in range(2)])
    assert r.returncode == 0, r.stderr
    workers = [c for c in calls if "--mpi=pmix" in c]
    assert len(workers) == 2 and all("--cpus-per-task=6" in c for c in workers)


def test_sbatch_exports_the_etcd_endpoint_and_fails_when_a_worker_fails(capsys, deployed, tmp_path):
    rc, out, err = serve(capsys, "one-node", deployed, "--launcher", "srun", "--image", "img:1")
    assert rc == 0, err
    assert 'export ETCD_ENDPOINTS="${HEAD_NODE_IP}:2379"' in written(out).read_text()
    fail = 'for a in "$@"; do [ "$a" = --mpi=pmix ] && { echo "$ETCD_ENDPOINTS" >&2; exit 3; }; done; exit 0'
    r, _ = run_sbatch(written(out), tmp_path, ["node-0"], fail)
    assert r.returncode == 3 and "10.0.0.1:2379" in r.stderr
    # A host whose name maps to 127.0.1.1 (Ubuntu's /etc/hosts): other nodes could not reach etcd there.
    r, calls = run_sbatch(written(out), tmp_path / "loopback", ["node-0"], ip="127.0.1.1")
    assert r.returncode == 1 and "no address of" in r.stderr and not [c for c in calls if "--overlap" in c]
    # etcd never answered: the job stops before any worker starts.
    r, calls = run_sbatch(written(out), tmp_path / "no-etcd", ["node-0"],
'case "$*" in *dev/tcp*) exit 1;; esac; exit 0')
    assert r.returncode == 1 and not [c for c in calls if "--mpi=pmix" in c]


# Kubernetes ------------------------------------------------------------------------------------

def dgd(capsys, name, deployed, *args) -> tuple[dict, dict, Path]:
    rc, out, err = serve(capsys, name, deployed, "--launcher", "k8s", *args)
    assert rc == 0, err
    path = written(out)
    assert path.name.endswith("-dgd.yaml")
    config_map, graph = yaml.safe_load_all(path.read_text())
    return config_map, graph, path


def schema_errors(doc: dict) -> list[str]:
    """The CRD's v1beta1 schema (strict) and the one CEL rule on what we write: component names
    unique case-insensitively."""
    import jsonschema

    errors = [f"{'/'.join(map(str, e.path))}: {e.message}"
              for e in jsonschema.Draft7Validator(dynamo.dgd_schema()).iter_errors(doc)]
    names = [c.get("name", "").lower() for c in doc.get("spec", {}).get("components", [])]
    return errors + (["component names must be unique case-insensitively"] if len(set(names)) < len(names) else [])


def by_name(graph: dict) -> dict[str, dict]:
    return {c["name"]: c for c in graph["spec"]["components"]}


def main_container(component: dict) -> dict:
    (container,) = [c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main"]
    return container


@pytest.mark.parametrize("name", ["one-node", "wide-replicas", "kv"])
def test_dgd_passes_the_crd_schema_and_kubernetes_own_schemas(capsys, deployed, name):
    kv = pytest.importorskip("kubernetes_validate")
    config_map, graph, _ = dgd(capsys, name, deployed, *(("--image", "registry.example/dynamo:1.6.1")
                                                         if name == "kv" else ()))
    assert schema_errors(graph) == []
    for component in graph["spec"]["components"]:
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
               "template": component["podTemplate"]}
        kv.validate(pod, "1.32.0", strict=True)
    kv.validate(config_map, "1.32.0", strict=True)


def test_the_schema_check_refuses_what_the_crd_refuses(capsys, deployed):
    """Negative controls: each mutation of our manifest breaks one rule the CRD states."""
    _, graph, _ = dgd(capsys, "wide-replicas", deployed)
    for mutate, expected in [
        (lambda g: g["spec"]["components"][0].update(type="router"), "is not one of"),
        (lambda g: g["spec"]["components"][1].update(multinode={"nodeCount": 1}), "less than the minimum"),
        (lambda g: g["spec"]["components"][1].update(resources={}), "Additional properties"),
        (lambda g: g["spec"]["components"][1].update(runtimeVersionOverride="v1.6.1"), "does not match"),
        (lambda g: g["spec"]["components"][1].update(name="frontend"), "unique case-insensitively"),
        (lambda g: g["spec"]["components"][1]["podTemplate"].update(spec={}), "'containers' is a required"),
    ]:
        bad = copy.deepcopy(graph)
        mutate(bad)
        assert any(expected in e for e in schema_errors(bad)), expected


def test_dgd_has_the_shape_of_the_wheels_agg_template(capsys, deployed):
    """The second check, against the facts read from the 1.6.1 wheel's
    dynamo/profiler/templates/dgd/trtllm/agg.yaml (recipe/catalog/dynamo-1.6.1.yaml template_agg)."""
    t = dynamo.facts()["template_agg"]
    def value(key):
        return t[key]["line"].split(":", 1)[1].strip() if ":" in t[key]["line"] else t[key]["line"][2:]
    config_map, graph, _ = dgd(capsys, "replicas", deployed)
    assert (graph["apiVersion"], graph["kind"]) == (value("apiVersion"), value("kind"))
    components = by_name(graph)
    assert list(components) == [value("frontend_name"), value("worker_name")]
    front, worker = components.values()
    assert (front["type"], worker["type"]) == (value("frontend_type"), value("worker_type"))
    assert main_container(front)["command"] == [value("frontend_command")]
    assert main_container(front)["args"][:2] == ["-m", value("frontend_args")]
    assert main_container(worker)["command"] == ["python3", "-m", value("worker_module")]
    assert main_container(front)["image"] == value("image") == main_container(worker)["image"]
    gpu_key, gpu_value = (s.strip() for s in t["gpu_limit"]["line"].split(":"))
    limit = main_container(worker)["resources"]["limits"][gpu_key]
    assert isinstance(limit, str) and isinstance(yaml.safe_load(gpu_value), str) and limit == "4"
    assert worker["replicas"] == 2 and front["replicas"] == 1
    assert value("main_container") == "main" and "runtimeVersionOverride" not in worker  # 1.6.1 is a semver tag


def test_dgd_engine_args_come_from_the_configmap_and_the_models_from_the_claim(capsys, deployed):
    config_map, graph, _ = dgd(capsys, "wide-replicas", deployed, "--pvc", "models", "--image", "mirror/dyn:latest")
    worker = by_name(graph)["TRTLLMWorker"]
    container, spec = main_container(worker), worker["podTemplate"]["spec"]
    args = parses("worker", container["args"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "engine-args")
    assert args.extra_engine_args == f"{mount['mountPath']}/engine_args.yaml"
    assert config_map["data"]["engine_args.yaml"] == (deployed["wide-replicas"] / "dynamo/engine_args.yaml").read_text()
    assert {"name": "engine-args", "configMap": {"name": config_map["metadata"]["name"]}} in spec["volumes"]
    claim = next(v for v in spec["volumes"] if v["name"] == "runs")["persistentVolumeClaim"]
    assert claim == {"claimName": "models", "readOnly": True}
    root = next(m for m in container["volumeMounts"] if m["name"] == "runs")["mountPath"]
    assert args.model.startswith(root + "/")
    assert worker["multinode"] == {"nodeCount": 2} and worker["replicas"] == 2
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # A tag that is no MAJOR.MINOR.PATCH version: DGD admission needs the runtime version stated.
    assert worker["runtimeVersionOverride"] == dynamo.version() == by_name(graph)["Frontend"]["runtimeVersionOverride"]


def test_default_image_is_the_catalogs_dynamo_runtime_for_the_pinned_trtllm(capsys, deployed):
    (row,) = [im for im in images.images() if im.family == "dynamo-trtllm-runtime"]
    assert (row.dynamo, row.trtllm) == (dynamo.version(), dynamo.trtllm_version())
    _, graph, _ = dgd(capsys, "one-node", deployed)
    assert main_container(by_name(graph)["TRTLLMWorker"])["image"] == row.ref
    _, graph, _ = dgd(capsys, "one-node", deployed, "--registry", "mirror.example:5000")
    assert main_container(by_name(graph)["Frontend"])["image"] == f"mirror.example:5000/{row.name}"


def test_deployed_launch_names_the_dynamo_release_and_serve_refuses_another(deployed, tmp_path):
    """A deployment written for another Dynamo release (its manifest intact) is one line: its
    flags were checked against that release's."""
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.launch.dynamo import read_launch

    data = json.loads((deployed["one-node"] / "dynamo/launch.json").read_text())
    assert data["dynamo"] == dynamo.version()
    (tmp_path / "dynamo").mkdir()
    (tmp_path / "dynamo/launch.json").write_text(json.dumps({**data, "dynamo": "1.5.0"}))
    with pytest.raises(UserError, match="written for Dynamo 1.5.0; this trtllm-dflash writes for Dynamo 1.6.1"):
        read_launch(load_recipe(GPT_OSS), tmp_path)
