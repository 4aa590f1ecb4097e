"""Every launch line (`serve --container`, `--launcher srun`, `--launcher k8s`) mounts every
directory a deployment's files name, and the engine backend's runs an image that has
trtllm_dflash: NVIDIA's image with this source checkout installed first, offline.

The directories a deployment names are read here from its files (every string of its JSON,
YAML and config.pbtxt files that is a path to something on disk outside it: absolute, or
relative to the deploy output), not from serve's own list (launch.served_paths)."""

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from test_cluster_launchers import REGISTRY, flag, parse_sbatch, rank, written

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir
from trtllm_dflash.cli import main
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.launch import cluster_job
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.containers import TRITON_TRTLLM_1_2

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"engine": ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml",
           "pytorch": ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"}


def _stage(root: Path, stage: str, recipe, input_dir: Path | None = None, **extra) -> Path:
    with atomic_stage_dir(root / stage, Manifest.for_stage(stage, recipe, input_dir, extra=extra)) as d:
        (d / "tokenizer").mkdir()
        (d / "tokenizer" / "tokenizer.json").write_text("{}")
    return root / stage


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    """backend -> deploy output, over stand-ins of the stages it reads (manifests): the engine
    backend's build made --from a convert output, so its deployment names both."""
    out = {}
    for backend, path in RECIPES.items():
        root = tmp_path_factory.mktemp(backend) / "runs" / "x"
        recipe = load_recipe(path)
        if backend == "engine":
            built = _stage(root, "build", recipe, _stage(root, "convert", recipe, layout="trtllm"), dry_run=False)
        else:
            built = _stage(root, "quantize", recipe, layout="hf")
        out[backend] = deploy(recipe, built, root / "deploy")
    return out


def _strings(path: Path) -> list[str]:
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        data = yaml.safe_load(text)
    else:  # config.pbtxt: its string values
        return re.findall(r'string_value: "([^"]*)"', text)
    found, todo = [], [data]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            todo += list(x.values())
        elif isinstance(x, list):
            todo += x
        elif isinstance(x, str):
            found.append(x)
    return found


def referenced(deploy_dir: Path) -> set[Path]:
    """Every file or directory outside `deploy_dir` that one of the deployment's files (its
    manifest and the files it lists) names."""
    deploy_dir = deploy_dir.resolve()
    out = set()
    for f in [deploy_dir / "manifest.json", *(deploy_dir / name for name in Manifest.read(deploy_dir).files)]:
        if f.suffix in (".json", ".yaml", ".pbtxt"):
            for s in _strings(f):
                p = Path(s) if s.startswith("/") else deploy_dir / s
                if "/" in s and p.exists() and deploy_dir not in p.resolve().parents and p.resolve() != deploy_dir:
                    out.add(p.resolve())
    return out


def covered(paths: set[Path], mounts: list[str]) -> list[Path]:
    """The paths no mount holds (mounts: host directories, mounted where they are)."""
    roots = [Path(m) for m in mounts]
    return [p for p in paths if not any(p == r or r in p.parents for r in roots)]


def serve(capsys, backend: str, deploy_dir: Path, *args) -> tuple[int, str, str]:
    rc = main(["serve", str(RECIPES[backend]), "--from", str(deploy_dir), *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_the_engine_deployment_names_its_build_and_the_checkpoint_beside_it(deployments):
    """What the mounts must hold: the checkpoint (tokenizer, manifest) is opened by the dflash
    model although deploy's input is the build; the scan finds both."""
    d = deployments["engine"]
    assert referenced(d) >= {(d.parent / "build").resolve(), (d.parent / "convert").resolve()}


@pytest.mark.parametrize("backend", sorted(RECIPES))
def test_docker_run_mounts_every_path_the_deployment_names(capsys, deployments, backend):
    d = deployments[backend]
    rc, out, err = serve(capsys, backend, d, *(["--api", "openai"] if backend == "pytorch" else []),
                         "--container", "image:1")
    assert rc == 0, err
    cmd = shlex.split(out.strip())
    image = cmd.index("image:1")
    mounts = [cmd[i + 1].split(":")[0] for i, a in enumerate(cmd[:image]) if a == "-v"]
    assert not covered(referenced(d) | {d.resolve()}, mounts)
    src = cluster_job.source_checkout()
    if backend == "engine":  # NVIDIA's image lacks trtllm_dflash: this checkout is installed first, offline
        assert src is not None and str(src) in mounts and cmd[image + 1:image + 3] == ["bash", "-c"]
        install, _, server = cmd[image + 3].partition(" && exec ")
        assert shlex.split(install)[:4] == ["python3", "-m", "pip", "install"]
        assert {"--no-index", "--no-deps", "--no-build-isolation"} <= set(shlex.split(install))
        assert shlex.split(install)[-2:] == ["-e", str(src)] and "tritonserver" in server
    else:  # TensorRT-LLM's own model: nothing of ours to install
        assert cmd[image + 1] == "trtllm-serve"


@pytest.mark.parametrize("backend", sorted(RECIPES))
def test_sbatch_mounts_every_path_the_deployment_names(capsys, deployments, backend):
    d = deployments[backend]
    rc, out, err = serve(capsys, backend, d, "--launcher", "srun", "--registry", REGISTRY,
                         *(["--api", "openai"] if backend == "pytorch" else []))
    assert rc == 0, err
    _, srun = parse_sbatch(written(out).read_text())
    mounts = [m.split(":")[0] for m in flag(srun, "--container-mounts").split(",")]
    assert not covered(referenced(d) | {d.resolve()}, mounts)
    if backend == "engine":
        assert flag(srun, "--container-image") == f"{REGISTRY}#{TRITON_TRTLLM_1_2}"
        assert rank(srun)[:2] == ["bash", "-c"] and "--no-index" in rank(srun)[2]


def test_kubernetes_pods_install_the_checkout_from_the_claim(capsys, deployments, monkeypatch, tmp_path_factory):
    """Without --image the engine pod installs the checkout, which the claim then holds too
    (read-write, beside the served directories); the claim's root holds every named path."""
    d = deployments["engine"]
    src = d.parents[1] / "checkout"  # a checkout beside runs/, as when runs/ lives in it
    src.mkdir(exist_ok=True)
    monkeypatch.setattr(cluster_job, "source_checkout", lambda: src)
    rc, out, err = serve(capsys, "engine", d, "--launcher", "k8s", "--registry", REGISTRY)
    assert rc == 0, err
    lws = next(doc for doc in yaml.safe_load_all(written(out).read_text()) if doc["kind"] == "LeaderWorkerSet")
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    (container,) = pod["containers"]
    runs = next(m for m in container["volumeMounts"] if m["name"] == "runs")
    assert not covered(referenced(d) | {d.resolve(), src}, [runs["mountPath"]]) and runs["readOnly"] is False
    assert container["image"] == f"{REGISTRY}/{TRITON_TRTLLM_1_2}"
    assert container["command"][:2] == ["bash", "-c"] and f"-e {src}" in container["command"][2]
    # An installed (not source) trtllm_dflash cannot be installed by the job: --image is asked for.
    monkeypatch.setattr(cluster_job, "source_checkout", lambda: None)
    rc, _, err = serve(capsys, "engine", d, "--launcher", "k8s", "--registry", REGISTRY)
    assert rc == 2 and err.count("\n") == 1
    assert "--image: the engine backend's Triton model imports trtllm_dflash" in err
