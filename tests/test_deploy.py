"""deploy/k8s and deploy/docker, checked offline: manifests against the Kubernetes schema (kubernetes-validate
--strict), their multi-node wiring against itself, the files they name against gpuval's own loaders, and
the Dockerfile through hadolint. No cluster and no Docker engine run here (REFERENCE.md)."""

from __future__ import annotations

import json
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


# --- NCCL environment profiles and shell scripts -------------------------------------------------------

ENV_PROFILES = sorted((REPO / "deploy" / "env").glob("*.env"))
SHELL_SCRIPTS = [
    *sorted((REPO / "deploy" / "slurm").glob("*.sbatch")),
    *sorted((REPO / "deploy" / "slurm").glob("*.sh")),
    *sorted((REPO / "benchmarks").glob("*.sh")),
    REPO / ".ci" / "run",
    *ENV_PROFILES,
]


def test_shell_scripts_and_env_profiles_pass_bash_n_and_shellcheck():
    for script in SHELL_SCRIPTS:
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{script.name}: {syntax.stderr}"
    proc = subprocess.run(
        [_tool("shellcheck"), *map(str, SHELL_SCRIPTS)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("profile", ENV_PROFILES, ids=lambda p: p.name)
def test_env_profile_is_data_that_bash_and_kubectl_read_alike_and_names_itself(profile):
    """KEY=VALUE lines only (what `kubectl create configmap --from-env-file` accepts), every key one that
    discover records, GPUVAL_ENV_PROFILE = the file's name; bash's `set -a; source` exports the same."""
    from gpuval.discover.software import communication_env

    pairs = {}
    for line in profile.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S*)", line)
        assert match, f"{profile.name}: not a KEY=VALUE line: {line!r}"
        pairs[match[1]] = match[2]
    assert pairs.pop("GPUVAL_ENV_PROFILE") == profile.stem
    recorded = communication_env({**pairs, "GPUVAL_ENV_PROFILE": profile.stem, "HOME": "/root"})
    assert recorded == {"profile": profile.stem, "variables": dict(sorted(pairs.items()))}
    exported = subprocess.run(
        ["bash", "-c", 'set -a; source "$1"; set +a; env -0', "bash", str(profile)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    env = dict(item.split("=", 1) for item in exported.split("\0") if "=" in item)
    assert {key: env.get(key) for key in [*pairs, "GPUVAL_ENV_PROFILE"]} == {
        **pairs,
        "GPUVAL_ENV_PROFILE": profile.stem,
    }


@pytest.mark.parametrize("script", ["accept.sbatch", "finetune.sbatch"])
def test_a_missing_env_profile_stops_the_job_before_any_step(script, tmp_path):
    """A typo in GPUVAL_ENV must not run the job without its NCCL settings: exit 2, one line that says
    what to pass. (The script checks it before its first srun, so no Slurm is needed here.)"""
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "7",
        "GPUVAL_OUTPUT": str(tmp_path / "out"),
        "GPUVAL_ENV": str(tmp_path / "hgx-ib.env"),
    }
    command = ["bash", str(REPO / "deploy" / "slurm" / script)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuval: GPUVAL_ENV={tmp_path / 'hgx-ib.env'} is not a readable file: give a path, e.g. "
        "$PWD/deploy/env/hgx-ib.env"
    ]


HEALTHCHECK = str(REPO / "deploy" / "slurm" / "healthcheck.sh")


def fake_scontrol(tmp_path: Path) -> tuple[str, Path]:
    """(PATH with a `scontrol` first that only records its arguments, the file it records them in): the
    drain the script asks Slurm for, without a Slurm."""
    folder, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    folder.mkdir()
    tool = folder / "scontrol"
    tool.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >>"{calls}"\n')
    tool.chmod(0o755)
    return f"{folder}:/usr/bin:/bin", calls


def test_healthcheck_reads_its_settings_from_a_file_as_slurmd_gives_it_no_environment(tmp_path):
    """slurmd runs HealthCheckProgram with PATH=/bin:/usr/bin and little else; the python3 there has no
    gpuval, so without its settings file the check could never run (and never drain). The file supplies
    them; a variable already in the environment wins; an unknown key is reported."""
    log = tmp_path / "log"
    conf = tmp_path / "healthcheck.conf"
    conf.write_text(
        f"# gpuval health check settings\nGPUVAL_PYTHON={sys.executable}\nGPUVAL_HEALTH_LOG={log}\n"
        "GPUVAL_PROFILE=cpu\nTYPO=1\n"
    )
    path, calls = fake_scontrol(tmp_path)
    bare = {"PATH": path, "SLURMD_NODENAME": "node1", "GPUVAL_HEALTHCHECK_CONF": str(conf)}
    proc = subprocess.run(["bash", HEALTHCHECK], capture_output=True, text=True, env=bare, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert f"{conf}: unknown setting 'TYPO' ignored" in proc.stderr
    result = json.loads((log / "health" / "result.json").read_text(encoding="utf-8"))
    assert result["verdict"] == "PASS" and result["profile"] == "cpu"  # gpuval ran, from the file's python

    overridden = {**bare, "GPUVAL_PYTHON": "/usr/bin/false"}
    proc = subprocess.run(["bash", HEALTHCHECK], capture_output=True, text=True, env=overridden, timeout=180)
    assert proc.returncode == 0 and "could not check node1 (exit 3)" in proc.stderr
    assert not calls.exists()  # neither drained the node


def test_healthcheck_without_a_profile_drains_the_node_before_running_gpuval(tmp_path):
    """A picked profile would judge a node by what it shows (a dead driver shows no GPU): without
    GPUVAL_PROFILE or --profile in GPUVAL_HEALTH_ARGS the check fails closed, with one line."""
    conf = tmp_path / "healthcheck.conf"
    conf.write_text("GPUVAL_PYTHON=/usr/bin/false\nGPUVAL_HEALTH_ARGS=--set expect.gpu_count=8\n")
    path, calls = fake_scontrol(tmp_path)
    env = {"PATH": path, "SLURMD_NODENAME": "node1", "GPUVAL_HEALTHCHECK_CONF": str(conf)}
    proc = subprocess.run(["bash", HEALTHCHECK], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"gpuval healthcheck: node1 drained: no profile configured; set GPUVAL_PROFILE in {conf}"
    ]
    assert calls.read_text() == (
        "update NodeName=node1 State=DRAIN Reason=gpuval: health check has no profile configured\n"
    )

    calls.unlink()  # --profile among the arguments is a profile too: gpuval runs (here: /usr/bin/false)
    given = {**env, "GPUVAL_HEALTH_ARGS": "--profile=h100-sxm"}
    proc = subprocess.run(["bash", HEALTHCHECK], capture_output=True, text=True, env=given, timeout=60)
    assert proc.returncode == 0 and "could not check node1 (exit 3)" in proc.stderr
    assert not calls.exists()
