"""The Kubernetes launcher: a LeaderWorkerSet manifest and its Service, one group of pods per
model copy, the leader running a Job's server command and the workers sshd for its mpirun.

Upstream facts it follows (read, not copied): the LeaderWorkerSet API
(leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go
at 024af084, pkg/utils/pod/pod_utils.go `AddLWSVariables` at 1b17603c): a group is one leader pod
`<name>-<group>` and workers `<name>-<group>-<i>` sharing the leader's DNS subdomain; LWS injects
LWS_LEADER_ADDRESS (`<name>-<group>.<subdomain>.<namespace>`), LWS_GROUP_SIZE and
LWS_WORKER_INDEX (0 on the leader) and labels every pod with `leaderworkerset.sigs.k8s.io/name`
and `.../worker-index`. It creates a headless Service named like the set, so ours is
`<name>-api`. TensorRT-LLM's ranks form one MPI world started from the leader: the leader runs
`mpirun` over ssh into the workers, which run sshd (the pattern of NVIDIA Dynamo's operator,
deploy/cloud/operator/internal/dynamo/backend_trtllm.go at 02b3bad0: port 2222, a key pair from a
Secret, OMPI_MCA_orte_keep_fqdn_hostnames=1 so remote daemons get resolvable names). Pods of a
group start together (startupPolicy LeaderCreated: LeaderReady would wait for a leader that waits
for its workers), and a group restarts as a whole (RecreateGroupOnPodRestart): an MPI world does
not survive a lost rank.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from trtllm_dflash.launch.cluster_job import (
    ClusterOptions,
    Job,
    claim_root,
    image_reference,
    prepared,
    rank_command,
    storage_note,
    writable,
)
from trtllm_dflash.launch.node_command import mpi_world
from trtllm_dflash.recipe.support import backend as backend_spec

SSH_PORT = 2222  # unprivileged: the worker's sshd needs no root to bind it
SSH_KEYS = "/etc/trtllm-dflash/mpi-ssh"  # the Secret's mount: id_ed25519, id_ed25519.pub
STORAGE_ANNOTATION = "trtllm-dflash/shared-storage"  # on the LeaderWorkerSet: what its claim must be
READY_PATH = {"triton": "/v2/health/ready", "openai": "/health"}  # Triton's and trtllm-serve's readiness


def _ports(job: Job) -> list[dict]:
    e = job.endpoints
    named = [("http", e.http_port)]
    if job.api == "triton":
        named += [("grpc", e.grpc_port), ("metrics", e.metrics_port)]
    return [{"name": name, "containerPort": port} for name, port in named]


def leader_command(job: Job, opts: ClusterOptions) -> list[str]:
    """The leader's process, after what the container needs first (`prepared`). One node: the
    rank command, the ranks under a local mpirun. Several: wait for every worker's sshd (the pods
    start together, not in order), then one mpirun over ssh places `gpus_per_node` ranks on each
    pod, filling the leader first (rank 0, the server, stays where the Service and the readiness
    probe look)."""
    rank = rank_command(job, slurm=False)
    if not backend_spec(job.backend).spans_nodes or job.world == 1:
        return prepared(job, opts, rank)
    if job.where.nodes == 1:
        return prepared(job, opts, mpi_world(job.world, rank))
    w, key = job.where, "$HOME/.ssh/id_ed25519"
    ssh = f"-p {SSH_PORT} -i {key} -o BatchMode=yes -o StrictHostKeyChecking=no"
    # mpirun by absolute path: Open MPI then starts its remote daemons from the same prefix (ssh
    # sessions do not get the image's PATH). --bind-to none: TensorRT-LLM sets each rank's CPU
    # affinity itself (base_worker.py configure_cpu_affinity).
    mpirun = ['"$(command -v mpirun)"', "--allow-run-as-root", "-np", str(job.world), "--map-by", "slot",
              "--bind-to", "none"]
    script = [
        "set -eu",
        *(job.llmapi.prelude(multi_rank=True) if job.llmapi else []),
        'mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"',
        f'install -m 600 {SSH_KEYS}/id_ed25519 "{key}"',
        'group="${LWS_LEADER_ADDRESS%%.*}"; domain="${LWS_LEADER_ADDRESS#*.}"',
        f'hosts="$LWS_LEADER_ADDRESS:{w.gpus_per_node}"',
        'for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do',
        '  worker="$group-$i.$domain"',
        f'  until ssh {ssh} "$worker" true 2>/dev/null; do echo "waiting for $worker"; sleep 5; done',
        f'  hosts="$hosts,$worker:{w.gpus_per_node}"',
        "done",
        " ".join(["exec", *mpirun, '-H "$hosts"', "--mca", "plm_rsh_args", f'"{ssh}"', "-x", "PATH",
                  "-x", "LD_LIBRARY_PATH", shlex.join(rank)]),
    ]
    return ["/bin/bash", "-c", "\n".join(script)]


def worker_command() -> list[str]:
    """A worker pod's process: sshd on SSH_PORT accepting the Secret's key, in the foreground; the
    leader's mpirun starts this pod's ranks through it."""
    script = [
        "set -eu",
        'sshd="$(command -v sshd || echo /usr/sbin/sshd)"',
        '[ -x "$sshd" ] || { echo "trtllm-dflash: this image has no sshd (openssh-server); the workers of a '
        'multi-node group need it: the leader starts their ranks over ssh" >&2; exit 1; }',
        'mkdir -p "$HOME/.ssh" /run/sshd && chmod 700 "$HOME/.ssh"',
        f'install -m 600 {SSH_KEYS}/id_ed25519.pub "$HOME/.ssh/authorized_keys"',
        'rm -f "$HOME/.ssh/host_ed25519" && ssh-keygen -q -t ed25519 -N "" -f "$HOME/.ssh/host_ed25519"',
        f'exec "$sshd" -D -e -p {SSH_PORT} -h "$HOME/.ssh/host_ed25519" -o PasswordAuthentication=no '
        "-o PermitRootLogin=prohibit-password -o AuthorizedKeysFile=.ssh/authorized_keys",
    ]
    return ["/bin/bash", "-c", "\n".join(script)]


def _volumes(job: Job, opts: ClusterOptions) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): shared memory for NCCL and MPI (a container's default /dev/shm is 64 MB),
    the claim holding the served directories at their paths (read-write when the job writes
    there: `writable`), and the ssh keys across nodes."""
    read_only, root = not writable(job, opts), claim_root(job, opts)
    claim = {"claimName": opts.pvc or f"{job.name}-runs", "readOnly": read_only}
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "runs", "persistentVolumeClaim": claim}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "runs", "mountPath": str(root), "readOnly": read_only}]
    if job.where.nodes > 1:
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": opts.ssh_secret or f"{job.name}-mpi-ssh",
                                                      "defaultMode": 0o400}})
        mounts.append({"name": "mpi-ssh", "mountPath": SSH_KEYS, "readOnly": True})
    return volumes, mounts


def pod_template(job: Job, opts: ClusterOptions, leader: bool) -> dict:
    """A pod of the group: the leader runs the server (ports, readiness on its health endpoint),
    a worker runs sshd; both hold a node's GPUs, shared memory and the served directories."""
    volumes, mounts = _volumes(job, opts)
    container = {
        "name": "server" if leader else "worker",
        "image": image_reference(job, opts, slurm=False),
        "command": leader_command(job, opts) if leader else worker_command(),
        "resources": {"limits": {"nvidia.com/gpu": job.where.gpus_per_node}},
        "volumeMounts": mounts,
    }
    if job.where.nodes > 1:
        container["env"] = [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"}]
    if leader:
        container["ports"] = _ports(job)
        # One health endpoint, three probes. The startup probe gives loading up to 30 minutes
        # before liveness counts (a failing liveness probe restarts the whole group,
        # RecreateGroupOnPodRestart). Liveness then restarts a group whose rank died: the server
        # stays up but unloads its model (triton_model.mark_unavailable), which nothing else mends.
        probe = {"httpGet": {"path": READY_PATH[job.api], "port": "http"}, "periodSeconds": 10}
        container["startupProbe"] = {**probe, "failureThreshold": 180}
        container["readinessProbe"] = {**probe, "failureThreshold": 3}
        container["livenessProbe"] = {**probe, "failureThreshold": 6}
    labels = {"app.kubernetes.io/name": "trtllm-dflash", "app.kubernetes.io/instance": job.name,
              "role": "leader" if leader else "worker"}
    return {"metadata": {"labels": labels}, "spec": {"containers": [container], "volumes": volumes}}


def leader_worker_set(job: Job, opts: ClusterOptions) -> dict:
    """One group of `nodes` pods per model copy (`spec.replicas`: parallel.replicas); with one node
    the leader is the whole group (LWS requires a workerTemplate and uses it for the leader when
    no leaderTemplate is given)."""
    template: dict = {"size": job.where.nodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    if job.where.nodes > 1:
        template["leaderTemplate"] = pod_template(job, opts, leader=True)
        template["workerTemplate"] = pod_template(job, opts, leader=False)
    else:
        template["workerTemplate"] = pod_template(job, opts, leader=True)
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": job.name, "labels": {"app.kubernetes.io/name": "trtllm-dflash"},
                     "annotations": {STORAGE_ANNOTATION: storage_note("k8s", job, opts)}},
        "spec": {"replicas": job.where.replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template},
    }


def leader_service(job: Job) -> dict:
    """The leader's ports: LWS's own labels pick the leader (worker index 0) of every group of this
    set, so with replicas the Service spreads connections over the copies."""
    ports = [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]} for p in _ports(job)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{job.name}-api", "labels": {"app.kubernetes.io/name": "trtllm-dflash"}},
        "spec": {"selector": {"leaderworkerset.sigs.k8s.io/name": job.name,
                              "leaderworkerset.sigs.k8s.io/worker-index": "0"},
                 "ports": ports},
    }


def lws_manifest(job: Job, opts: ClusterOptions, path: Path) -> str:
    """The LeaderWorkerSet and its Service as one multi-document YAML, for `kubectl apply -f PATH`."""
    w = job.where
    head = [f"Generated by `trtllm-dflash serve --launcher k8s` from recipe {job.recipe!r} ({job.backend} backend, "
            f"--api {job.api}).",
            f"{w.replicas} group(s) (parallel.replicas), each one model copy of {w.nodes} pod(s) x {w.gpus_per_node} "
            "GPU(s); needs the LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1).",
            f"The Service {job.name}-api is the one endpoint: it spreads connections over every group's leader.",
            f"Shared storage: {storage_note('k8s', job, opts)}.",
            f"Apply: kubectl apply -f {shlex.quote(str(path))}"]
    if w.nodes > 1:
        secret = opts.ssh_secret or f"{job.name}-mpi-ssh"
        head.append(f"First: ssh-keygen -t ed25519 -N '' -f key && kubectl create secret generic {secret} "
                    "--from-file=id_ed25519=key --from-file=id_ed25519.pub=key.pub (the image needs sshd on workers)")
    docs = yaml.dump_all([leader_worker_set(job, opts), leader_service(job)], Dumper=BlockDumper, sort_keys=False)
    return "".join(f"# {line}\n" for line in head) + docs


class BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the pods' shell scripts) as YAML literal blocks, readable as written."""


BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))
