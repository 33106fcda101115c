"""Who started this process: the Slurm job and step, the Kubernetes pod, torchrun's rank layout, and
which GPUs the launcher made visible. Read from the environment (a parameter, for tests) and, for the
pod's namespace, the service-account file under `root`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuval.discover.host import read_text
from gpuval.runtime import launcher_env

# environment variable -> key in the inventory; sbatch(1) and srun(1) "OUTPUT ENVIRONMENT VARIABLES"
SLURM_VARIABLES = {
    "SLURM_CLUSTER_NAME": "cluster",
    "SLURM_JOB_ID": "job_id",
    "SLURM_JOB_NAME": "job_name",
    "SLURM_JOB_PARTITION": "partition",
    "SLURM_JOB_ACCOUNT": "account",
    "SLURM_JOB_NODELIST": "job_nodelist",
    "SLURM_NNODES": "nnodes",
    "SLURM_NTASKS": "ntasks",
    "SLURM_NTASKS_PER_NODE": "ntasks_per_node",
    "SLURM_STEP_ID": "step_id",
    "SLURM_STEP_NODELIST": "step_nodelist",
    "SLURM_PROCID": "procid",
    "SLURM_LOCALID": "localid",
    "SLURM_NODEID": "nodeid",
    "SLURMD_NODENAME": "nodename",
    "SLURM_CPUS_ON_NODE": "cpus_on_node",
    "SLURM_GPUS_ON_NODE": "gpus_on_node",
    "SLURM_JOB_GPUS": "job_gpus",
    "SLURM_STEP_GPUS": "step_gpus",
    "SLURM_GPUS_PER_NODE": "gpus_per_node",
}
TORCHRUN_VARIABLES = {
    "RANK": "rank",
    "WORLD_SIZE": "world_size",
    "LOCAL_RANK": "local_rank",
    "LOCAL_WORLD_SIZE": "local_world_size",
    "GROUP_RANK": "group_rank",
    "MASTER_ADDR": "master_addr",
    "MASTER_PORT": "master_port",
    "TORCHELASTIC_RUN_ID": "run_id",
}
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _value(text: str) -> int | str:
    return int(text) if text.isdecimal() else text


def _pick(environ: Mapping[str, str], names: dict[str, str]) -> dict[str, Any]:
    return {key: _value(environ[name]) for name, key in names.items() if name in environ}


def scheduler_context(environ: Mapping[str, str] | None = None, root: Path = Path("/")) -> dict[str, Any]:
    """{'launcher', 'slurm', 'kubernetes', 'torchrun', 'visible_devices'}; a context absent is None."""
    env = os.environ if environ is None else environ
    kubernetes = None
    if "KUBERNETES_SERVICE_HOST" in env:
        kubernetes = {
            "pod": env.get("HOSTNAME"),  # the kubelet sets a pod's hostname to its name
            "namespace": read_text(root / NAMESPACE_FILE) or env.get("POD_NAMESPACE"),
            "node": env.get("NODE_NAME") or env.get("K8S_NODE_NAME"),  # only where the downward API sets it
        }
    try:
        launcher = launcher_env(dict(env))
    except ValueError:  # SLURM_NTASKS that is not a number: say so rather than guess
        launcher = "unknown"
    return {
        "launcher": launcher,
        "slurm": _pick(env, SLURM_VARIABLES) if "SLURM_JOB_ID" in env else None,
        "kubernetes": kubernetes,
        "torchrun": _pick(env, TORCHRUN_VARIABLES) if "RANK" in env or "TORCHELASTIC_RUN_ID" in env else None,
        "visible_devices": {name: env[name] for name in VISIBILITY_VARIABLES if name in env},
    }
