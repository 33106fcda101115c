"""deploy/k8s and deploy/docker, checked offline: manifests against the Kubernetes schema (kubernetes-validate
--strict), their multi-node wiring against itself, the files they name against gpuval's own loaders, and
the Dockerfile through hadolint. No cluster and no Docker engine run here (REFERENCE.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuval.config import load_profile
from gpuval.finetune.config import load_finetune_config

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((REPO / "deploy" / "k8s").glob("*.yaml"))
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes_under_strict_validation(manifest):
    proc = subprocess.run(
        [_tool("kubernetes-validate"), "--strict", str(manifest)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # kubernetes-validate only warns on kinds it does not know (an operator's CRD): none allowed here
    assert "WARN" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_indexed_job_and_headless_service_agree_on_nodes_gpus_and_rendezvous(manifest):
    docs = {d["kind"]: d for d in yaml.safe_load_all(manifest.read_text(encoding="utf-8"))}
    job, service = docs["Job"], docs["Service"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = " ".join(container["args"])
    option = dict(re.findall(r"--([a-z-]+)=(\S+)", command))
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(option["nnodes"])
    assert option["node-rank"] == '"$JOB_COMPLETION_INDEX"'
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["subdomain"] == service["metadata"]["name"]
    # rank 0 is pod 0 of the job, through the headless Service's DNS
    assert option["master-addr"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert int(option["master-port"]) == service["spec"]["ports"][0]["port"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == container["resources"]["requests"]["nvidia.com/gpu"] == int(option["nproc-per-node"])
    assert pod["securityContext"]["runAsUser"] != 0


def test_the_files_the_manifests_load_into_configmaps_are_valid_for_gpuval():
    """Each manifest says which file to load into its ConfigMap (`kubectl create configmap ...`): it must
    be a profile or fine-tune config gpuval accepts, and the pod must read it where it is mounted."""
    checked = 0
    for manifest in MANIFESTS:
        text = manifest.read_text(encoding="utf-8")
        name, key, source = re.search(r"create configmap (\S+) --from-file=(\S+?)=(\S+)", text).groups()
        mount = next(
            m["mountPath"]
            for m in next(d for d in yaml.safe_load_all(text) if d["kind"] == "Job")["spec"]["template"][
                "spec"
            ]["containers"][0]["volumeMounts"]
            if m["name"] in ("profile", "config")
        )
        assert f"{mount}/{key}" in text and f"name: {name}" in text
        if "--profile" in text:
            assert load_profile(str(REPO / source)).expect.gpu_count == 8
        else:
            assert load_finetune_config(REPO / source).train.max_steps > 0
        checked += 1
    assert checked == len(MANIFESTS) == 2


def test_dockerfile_passes_hadolint_and_runs_as_a_non_root_user():
    proc = subprocess.run([_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    users = re.findall(r"^USER (\S+)", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
