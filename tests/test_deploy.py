"""deploy/k8s and deploy/docker, checked offline: manifests against the Kubernetes schema (kubernetes-validate
--strict), their multi-node wiring against itself, the files they name against gpuval's own loaders, and
the Dockerfile through hadolint. No cluster and no Docker engine run here (docs/deploy-testing.md)."""

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


def test_the_image_installs_every_runtime_dependency_but_torch():
    """The image takes its requirements from pyproject.toml (deploy/docker/requirements.py): every core
    dependency and the finetune, gpu and fa4 extras (Liger-Kernel and FlashAttention-4 included), never
    torch, whose CUDA build the image pins on a line of its own (tests/test_versions.py)."""
    import tomllib

    proc = subprocess.run(
        [sys.executable, str(DOCKERFILE.parent / "requirements.py"), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split()
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["finetune"]]
    wanted += project["optional-dependencies"]["gpu"] + project["optional-dependencies"]["fa4"]
    assert listed == [req for req in wanted if not req.startswith("torch")]
    names = {re.split(r"[<>=!~]", req)[0] for req in listed}
    assert {"liger-kernel", "flash-attn-4", "matplotlib", "prometheus-client", "transformers"} <= names
    assert "torch" not in names
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert (
        "deploy/docker/requirements.py" in text
        and "pip install --no-cache-dir -r /tmp/requirements.txt" in text
    )


# --- NCCL environment profiles and shell scripts -------------------------------------------------------

ENV_PROFILES = sorted((REPO / "deploy" / "env").glob("*.env"))
SHELL_SCRIPTS = [
    *sorted((REPO / "deploy" / "slurm").glob("*.sbatch")),
    *sorted((REPO / "deploy" / "slurm").glob("*.sh")),
    *sorted((REPO / "benchmarks").glob("*.sh")),
    *sorted((REPO / "tools").glob("**/*.sh")),
    REPO / ".ci" / "run",
    REPO / ".ci" / "lock",
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


def _fake_slurm(tmp_path: Path) -> tuple[str, Path]:
    """(PATH with `sinfo` and `srun` stubs first, the file the last srun wrote its environment to): what
    the job's steps would get, without a Slurm."""
    folder, seen = tmp_path / "bin", tmp_path / "srun.env"
    folder.mkdir()
    (folder / "sinfo").write_text("#!/bin/sh\nexit 0\n")
    (folder / "srun").write_text(f'#!/bin/sh\nenv -0 >"{seen}"\n')
    for tool in ("sinfo", "srun"):
        (folder / tool).chmod(0o755)
    return f"{folder}:/usr/bin:/bin", seen


def _job(script: str, tmp_path: Path, env_file: Path) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    path, seen = _fake_slurm(tmp_path)
    env = {
        "PATH": path,
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "GPUVAL_OUTPUT": str(tmp_path / "out"),
        "GPUVAL_ENV": str(env_file),
    }
    command = ["bash", str(REPO / "deploy" / "slurm" / script)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    exported = seen.read_text() if seen.exists() else ""
    return proc, dict(item.split("=", 1) for item in exported.split("\0") if "=" in item)


@pytest.mark.parametrize("script", ["accept.sbatch", "finetune.sbatch"])
def test_the_env_profile_is_read_as_data_and_a_command_in_a_value_never_runs(script, tmp_path):
    """GPUVAL_ENV used to be `source`d: a $(...) in a value ran on every job. Now every value reaches the
    job's steps exactly as written (one pair of quotes dropped), and nothing in it runs."""
    pwned = tmp_path / "pwned"
    env_file = tmp_path / "evil.env"
    env_file.write_text(
        "# a comment\n\n"
        f"X=$(touch {pwned}-dollar)\n"
        f"Y=`touch {pwned}-backtick`\n"
        f"Z=1; touch {pwned}-semicolon\n"
        'QUOTED="two words $HOME"\n'
        "SINGLE='it''s'\n"
        "NCCL_IB_HCA=mlx5\n"
        "EMPTY=\n"
        "CRLF=value\r\n"
        "LAST=no newline at the end"
    )
    proc, seen = _job(script, tmp_path, env_file)
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.glob("pwned*"))
    assert {key: seen.get(key) for key in ("X", "Y", "Z", "QUOTED", "SINGLE", "NCCL_IB_HCA", "EMPTY")} == {
        "X": f"$(touch {pwned}-dollar)",
        "Y": f"`touch {pwned}-backtick`",
        "Z": f"1; touch {pwned}-semicolon",
        "QUOTED": "two words $HOME",
        "SINGLE": "it''s",
        "NCCL_IB_HCA": "mlx5",
        "EMPTY": "",
    }
    assert seen["CRLF"] == "value" and seen["LAST"] == "no newline at the end"


@pytest.mark.parametrize(
    "line",
    ["touch {tmp}/pwned", "lower_case=1", "1ABC=1", "A-B=1", " NCCL_DEBUG=INFO", "UID=0", "=value"],
)
def test_an_env_profile_line_that_is_not_key_value_stops_the_job_before_any_step(line, tmp_path):
    env_file = tmp_path / "bad.env"
    env_file.write_text(f"NCCL_DEBUG=WARN\n{line.format(tmp=tmp_path)}\n")
    proc, seen = _job("accept.sbatch", tmp_path, env_file)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert seen == {}  # no srun ran
    assert not (tmp_path / "pwned").exists()
    if line != "UID=0":  # a read-only shell variable: bash itself says so
        assert proc.stderr.strip().splitlines() == [
            f"gpuval: GPUVAL_ENV={env_file} line 2 is not KEY=VALUE with KEY like NCCL_IB_HCA: "
            + line.format(tmp=tmp_path)
        ]


@pytest.mark.parametrize("profile", ENV_PROFILES, ids=lambda p: p.name)
def test_the_jobs_export_each_shipped_env_profile_as_bash_source_would(profile, tmp_path):
    pairs = dict(
        line.split("=", 1)
        for line in profile.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    )
    for script in ("accept.sbatch", "finetune.sbatch"):
        (tmp_path / script).mkdir()
        proc, seen = _job(script, tmp_path / script, profile)
        assert proc.returncode == 0, proc.stderr
        assert {key: seen.get(key) for key in pairs} == pairs


def test_both_jobs_read_env_profiles_with_the_same_function():
    texts = [(REPO / "deploy" / "slurm" / name).read_text() for name in ("accept.sbatch", "finetune.sbatch")]
    functions = [re.search(r"\ngpuval_load_env\(\) \{\n.*?\n\}\n", text, re.S) for text in texts]
    assert functions[0] and functions[1] and functions[0][0] == functions[1][0]
    assert all("source" not in text.split("gpuval_load_env()")[1] for text in texts)


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
    # neither drained the node: the PASS only asked for the node's state (to resume a drain of its own)
    assert calls.read_text().splitlines() == ["show node node1"]


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
