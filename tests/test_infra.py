""".github/workflows/ci.yml and deploy/terraform, checked offline: the workflow through actionlint and
against what the repository has (.ci/run, the Dockerfile, the CLI); the Terraform through python-hcl2 and
checkov and against deploy/slurm, deploy/k8s and the profiles; the nodes' user data rendered as
Terraform's templatefile renders it, through bash -n and shellcheck, and its gpuval wrapper run against a
fake `docker`. No cloud account, no Docker engine and no GitHub runner here (docs/deploy-testing.md)."""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_deploy import _tool  # the dev extra's linters, found as tests/test_deploy.py finds them

from gpuval.config import load_profile

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"
TERRAFORM = REPO / "deploy" / "terraform"
TEMPLATES = TERRAFORM / "templates"
SLURM = REPO / "deploy" / "slurm"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


# --- .github/workflows/ci.yml --------------------------------------------------------------------------


def _jobs() -> dict[str, dict]:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]


def _steps(job: dict, action: str) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").startswith(action + "@")]


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_the_workflow_passes_actionlint_with_shellcheck_on_its_scripts():
    command = [_tool("actionlint"), "-no-color", "-shellcheck", _tool("shellcheck"), "-pyflakes="]
    proc = subprocess.run([*command, str(WORKFLOW)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_each_job_gets_only_the_permissions_it_uses_and_pushes_only_from_main_and_tags():
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert workflow["permissions"] == {}  # nothing unless a job asks
    jobs = workflow["jobs"]
    pushers = {
        name
        for name, job in jobs.items()
        if any(s["with"].get("push") for s in _steps(job, "docker/build-push-action"))
    }
    releasers = {name for name, job in jobs.items() if _steps(job, "softprops/action-gh-release")}
    assert len(pushers) == len(releasers) == 1
    for name, job in jobs.items():
        expected = {"contents": "read"}
        if name in pushers:
            expected["packages"] = "write"
        if name in releasers:
            expected = {"contents": "write"}
        assert job["permissions"] == expected, name
    (pusher,) = pushers
    (releaser,) = releasers
    # never from a pull request; the image only after the tests and the image's own test passed
    assert "github.event_name == 'push'" in jobs[pusher]["if"] and "refs/heads/main" in jobs[pusher]["if"]
    assert "startsWith(github.ref, 'refs/tags/v')" in jobs[releaser]["if"]
    tested = {name for name, job in jobs.items() if "docker run" in _runs(job)}
    assert tested and tested <= set(jobs[pusher]["needs"])
    assert pusher in jobs[releaser]["needs"]
    secrets = re.findall(r"secrets\.(\w+)", WORKFLOW.read_text(encoding="utf-8"))
    assert set(secrets) == {"GITHUB_TOKEN"}


def test_every_action_is_pinned_to_a_major_version_or_a_commit():
    uses = [step["uses"] for job in _jobs().values() for step in job["steps"] if "uses" in step]
    pinned = re.compile(r"[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})")
    assert uses and [action for action in uses if not pinned.fullmatch(action)] == []


def test_ci_runs_the_repository_ci_script_and_builds_the_repository_dockerfile():
    jobs = _jobs()
    (lint,) = [job for job in jobs.values() if "bash .ci/run" in _runs(job)]
    ci_run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    # .ci/run pins torch; the job's index makes the pin a CPU build, as the file on the CI machine is
    assert "install_lock .venv main" in ci_run  # the full suite's venv is the lock's, which pins torch
    lock = (REPO / ".ci" / "locks" / "main.txt").read_text(encoding="utf-8")
    assert re.search(r"^torch==\S+$", lock, re.M)
    assert lint["env"]["PIP_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "ruff check" in _runs(lint)
    builds = [step for job in jobs.values() for step in _steps(job, "docker/build-push-action")]
    assert len(builds) == 2  # the tested build, and the push that reuses its layers
    for step in builds:
        assert (REPO / step["with"]["file"]).resolve() == DOCKERFILE and step["with"]["context"] == "."
        assert step["with"]["cache-from"] == "type=gha" and step["with"]["cache-to"].startswith("type=gha")
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert workflow["env"]["IMAGE"] == "ghcr.io/${{ github.repository }}"
    (meta,) = [step for job in jobs.values() for step in _steps(job, "docker/metadata-action")]
    assert (
        meta["with"]["images"] == "${{ env.IMAGE }}"
        and "type=semver,pattern={{version}}" in meta["with"]["tags"]
    )


def test_the_container_job_runs_gpuval_commands_and_options_the_cli_has():
    """`docker run ... gpuval:ci ARGS`: ARGS must parse as a gpuval command line (the image's entry point is
    `python -m gpuval`), so a renamed command or option fails here, not on GitHub."""
    import typer.main

    from gpuval.cli import app

    group = typer.main.get_command(app)
    root = typer.Context(group, info_name="gpuval")
    root_options = {opt for param in group.get_params(root) for opt in param.opts}
    tag = next(
        s["with"]["tags"]
        for job in _jobs().values()
        for s in _steps(job, "docker/build-push-action")
        if s["with"].get("load")
    )
    lines = [line for job in _jobs().values() for line in _runs(job).splitlines() if f" {tag} " in line]
    commands = [re.split(r"\s*[>|;&]", line.split(f" {tag} ", 1)[1])[0].split() for line in lines]
    assert {args[0] for args in commands} >= {"--help", "--version", "discover", "accept"}
    for args in commands:
        if args[0].startswith("-"):
            assert set(args) <= root_options, args
            continue
        command = group.get_command(root, args[0])
        assert command is not None, args
        command.make_context(args[0], args[1:], parent=root)  # an unknown option raises


# --- deploy/terraform: parsed and scanned -------------------------------------------------------------


@functools.cache
def _hcl(name: str) -> dict:
    """A Terraform file as python-hcl2 reads it, strings unquoted (parsed once: callers only read it)."""
    hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install -e '.[dev]')")
    options = hcl2.SerializationOptions(with_comments=False, strip_string_quotes=True, explicit_blocks=False)
    with (TERRAFORM / name).open(encoding="utf-8") as file:
        return hcl2.load(file, serialization_options=options)


def _variables() -> dict[str, dict]:
    return {name: body for block in _hcl("variables.tf")["variable"] for name, body in block.items()}


def _gpu_types() -> dict[str, dict]:
    return _hcl("main.tf")["locals"][0]["gpu_types"]


def _resource(kind: str, name: str) -> dict:
    return next(block[kind][name] for block in _hcl("main.tf")["resource"] if name in block.get(kind, {}))


def test_terraform_parses_and_every_variable_is_declared_used_and_in_the_example():
    text = "".join((TERRAFORM / name).read_text(encoding="utf-8") for name in ("main.tf", "outputs.tf"))
    used = set(re.findall(r"\bvar\.(\w+)", text))
    declared = _variables()
    assert used == set(declared)
    assert _hcl("outputs.tf")["output"]
    example = _hcl("terraform.tfvars.example")
    assert set(example) <= set(declared)
    required = {name for name, body in declared.items() if "default" not in body}
    assert required <= set(example), "the example leaves required variables out"
    assert example["gpu_type"] in _gpu_types() and example["node_count"] == declared["node_count"]["default"]
    # the image as CI pushes it: metadata-action's {{version}} tag, a bare semver
    assert re.fullmatch(r"ghcr\.io/[\w.-]+/[\w.-]+:\d+\.\d+\.\d+", example["gpuval_image"])


# Settings checkov reads on aws_instance only, which the GPU nodes take from their launch template
# instead; each skip in main.tf says so, and this test checks that the template does carry the setting.
INSTANCE_SETTINGS_IN_THE_LAUNCH_TEMPLATE = {
    "CKV_AWS_79",
    "CKV_AWS_126",
    "CKV_AWS_135",
    "CKV_AWS_8",
    "CKV2_AWS_41",
}
KEY_POLICY_RESOURCE_STAR = {"CKV_AWS_109", "CKV_AWS_111", "CKV_AWS_356"}


@pytest.mark.slow
def test_checkov_finds_no_failed_check_and_every_skip_is_true():
    command = [_tool("checkov"), "-d", str(TERRAFORM), "--framework", "terraform", "--compact"]
    command += ["--skip-download", "-o", "json"]  # offline: no guideline download
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    report = json.loads(proc.stdout)
    failed = [(c["check_id"], c["resource"], c["check_name"]) for c in report["results"]["failed_checks"]]
    assert not failed and report["summary"]["parsing_errors"] == 0, failed
    assert proc.returncode == 0, proc.stderr
    skipped = {}
    for check in report["results"]["skipped_checks"]:
        assert check["check_result"]["suppress_comment"].strip(), check["check_id"]  # a reason is stated
        skipped.setdefault(re.sub(r"\[\d+\]$", "", check["resource"]), set()).add(check["check_id"])
    assert skipped == {
        "aws_instance.gpu": INSTANCE_SETTINGS_IN_THE_LAUNCH_TEMPLATE,
        "aws_iam_policy_document.cluster_key": KEY_POLICY_RESOURCE_STAR,
    }
    template = _resource("aws_launch_template", "gpu")
    assert template["metadata_options"][0]["http_tokens"] == "required"  # CKV_AWS_79
    assert template["monitoring"][0]["enabled"] is True  # CKV_AWS_126
    assert template["ebs_optimized"] is True  # CKV_AWS_135
    assert template["block_device_mappings"][0]["ebs"][0]["encrypted"] is True  # CKV_AWS_8
    assert template["iam_instance_profile"][0]["arn"] == "${aws_iam_instance_profile.node.arn}"  # CKV2_AWS_41
    instance = _resource("aws_instance", "gpu")
    assert instance["launch_template"][0]["id"] == "${aws_launch_template.gpu[count.index].id}"
    key = _resource("aws_kms_key", "cluster")
    assert key["policy"] == "${data.aws_iam_policy_document.cluster_key.json}"


# --- deploy/terraform against deploy/slurm, deploy/k8s and the profiles -----------------------------


def test_node_count_and_gpus_per_node_agree_with_slurm_k8s_and_the_profiles():
    node_count = _variables()["node_count"]["default"]
    gpu_types = _gpu_types()
    assert _variables()["gpu_type"]["default"] in gpu_types
    manifests = [
        next(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d["kind"] == "Job")
        for path in sorted((REPO / "deploy" / "k8s").glob("*.yaml"))
    ]
    k8s_nodes = {job["spec"]["completions"] for job in manifests}
    k8s_gpus = {
        job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        for job in manifests
    }
    slurm_tasks, usage_nodes, usage_gpus = set(), set(), set()
    for script in ("accept.sbatch", "finetune.sbatch"):
        text = (SLURM / script).read_text(encoding="utf-8")
        slurm_tasks.add(int(re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", text, re.M)[1]))  # a task per GPU
        usage = re.search(
            r"^#\s+sbatch --nodes=(\d+) --ntasks-per-node=(\d+) --gpus-per-node=(\d+)", text, re.M
        )
        usage_nodes.add(int(usage[1]))
        usage_gpus.update({int(usage[2]), int(usage[3])})
    local_nodes = int(
        re.search(r"^nodes=\$\{NODES:-(\d+)\}$", (SLURM / "local-cluster.sh").read_text(), re.M)[1]
    )
    assert k8s_nodes == usage_nodes == {node_count} and local_nodes == node_count
    for gpu_type, row in gpu_types.items():
        profile = load_profile(row["profile"])
        assert {row["gpus_per_node"]} == k8s_gpus == slurm_tasks == usage_gpus == {profile.expect.gpu_count}
        assert gpu_type.upper() in profile.expect.gpu_name, (gpu_type, profile.expect.gpu_name)


def _template_arguments() -> dict[str, set[str]]:
    """templatefile(path, {args}) calls of main.tf: template file name -> the names of the arguments."""
    text = (TERRAFORM / "main.tf").read_text(encoding="utf-8")
    calls = re.findall(
        r'templatefile\("\$\{path\.module\}/templates/([\w.-]+)", \{(.*?)\n\s*\}\)', text, re.S
    )
    return {name: set(re.findall(r"^\s*(\w+)\s*=", body, re.M)) for name, body in calls}


def test_main_tf_gives_each_template_exactly_the_names_it_uses():
    arguments = _template_arguments()
    assert set(arguments) == {path.name for path in TEMPLATES.glob("*.tftpl")}
    for name, names in arguments.items():
        placeholders = re.findall(r"(?<!\$)\$\{([^}]*)\}", (TEMPLATES / name).read_text(encoding="utf-8"))
        assert set(placeholders) == names, name


def _render(name: str, values: dict[str, object]) -> str:
    """Terraform's templatefile for what the templates use: ${name} and the $${ escape. Anything else (an
    expression, a %{ directive) is an error here, so a template cannot outgrow this emulation silently."""
    template = (TEMPLATES / name).read_text(encoding="utf-8")
    assert "%{" not in template.replace("%%{", "")
    assert set(re.findall(r"(?<!\$)\$\{([^}]*)\}", template)) == set(values), name
    return re.sub(r"\$\$\{|\$\{(\w+)\}", lambda m: "${" if m[1] is None else str(values[m[1]]), template)


def _cluster(gpu_type: str) -> dict[str, object]:
    """main.tf's locals for the default variables: its cidrsubnet/cidrhost arguments and node names read
    from main.tf, computed as Terraform computes them."""
    variables, row, text = _variables(), _gpu_types()[gpu_type], (TERRAFORM / "main.tf").read_text()
    count = variables["node_count"]["default"]
    newbits, netnum = map(
        int, re.search(r"private_cidr += cidrsubnet\(var\.vpc_cidr, (\d+), (\d+)\)", text).groups()
    )
    private = list(ipaddress.ip_network(variables["vpc_cidr"]["default"]).subnets(prefixlen_diff=newbits))[
        netnum
    ]
    controller = int(re.search(r"controller_ip += cidrhost\(local\.private_cidr, (\d+)\)", text)[1])
    first_node = int(re.search(r"node_ips += \[.*cidrhost\(local\.private_cidr, (\d+) \+ index\)", text)[1])
    names = {
        re.search(r'node_names += \[.*: "(\w+)\$\{index \+ 1\}"\]', text)[1],
        re.search(r'node_range += "(\w+)\[1-\$\{var\.node_count\}\]"', text)[1],
    }
    assert len(names) == 1, "node_names and slurm.conf's node_range name the nodes alike"
    return {
        "row": row,
        "count": count,
        "prefix": names.pop(),
        "private": private,
        "controller_ip": str(private.network_address + controller),
        "node_ips": [str(private.network_address + first_node + index) for index in range(count)],
    }


def _rendered(gpu_type: str) -> dict[str, str]:
    cluster = _cluster(gpu_type)
    row = cluster["row"]
    slurm_conf = _render(
        "slurm.conf.tftpl",
        {
            "cluster_name": _variables()["cluster_name"]["default"],
            "controller_ip": cluster["controller_ip"],
            "node_range": f"{cluster['prefix']}[1-{cluster['count']}]",
            "node_addresses": ",".join(cluster["node_ips"]),
            **{key: row[key] for key in ("gpus_per_node", "sockets", "cores_per_socket", "threads_per_core")},
        },
    )
    gres_conf = _render("gres.conf.tftpl", {"last_gpu": row["gpus_per_node"] - 1})
    controller = {
        "slurm_conf": slurm_conf,
        "gres_conf": gres_conf,
        "private_cidr": str(cluster["private"]),
        "shared_serial": "vol0123456789abcdef0",
    }
    node = {
        "node_name": f"{cluster['prefix']}1",
        "controller_ip": cluster["controller_ip"],
        "gpuval_image": "ghcr.io/example/gpuval:0.1.0",
        "profile": row["profile"],
    }
    return {
        "slurm.conf": slurm_conf,
        "gres.conf": gres_conf,
        "controller.sh": _render("controller.sh.tftpl", controller),
        "gpu-node.sh": _render("gpu-node.sh.tftpl", node),
    }


def _heredoc(script: str, target: str) -> str:
    """The text a script writes to `target` with `cat >target <<'END'`."""
    match = re.search(rf"^cat >{re.escape(target)} <<'?(\w+)'?\n(.*?)\n\1$", script, re.M | re.S)
    assert match, target
    return match[2]


@pytest.mark.parametrize("gpu_type", ["h100", "h200"])
def test_slurm_conf_registers_the_nodes_as_deploy_slurm_and_the_image_expect(gpu_type):
    cluster, rendered = _cluster(gpu_type), _rendered(gpu_type)
    lines = [line for line in rendered["slurm.conf"].splitlines() if line and not line.startswith("#")]
    conf = dict(line.split("=", 1) for line in lines if " " not in line)
    node = dict(token.split("=", 1) for token in next(x for x in lines if x.startswith("NodeName=")).split())
    partition = dict(
        token.split("=", 1) for token in next(x for x in lines if x.startswith("PartitionName=")).split()
    )
    # node1..nodeN, as deploy/slurm/local-cluster.sh names its nodes
    local = re.search(
        r"NodeName=(\w+)\[1-\$nodes\]", (SLURM / "local-cluster.sh").read_text(encoding="utf-8")
    )
    assert node["NodeName"] == f"{local[1]}[1-{cluster['count']}]" == partition["Nodes"]
    addresses = node["NodeAddr"].split(",")
    assert addresses == cluster["node_ips"] and cluster["controller_ip"] not in addresses
    assert all(ipaddress.ip_address(a) in cluster["private"] for a in addresses)
    gpus = cluster["row"]["gpus_per_node"]
    assert node["Gres"] == f"gpu:{gpus}" and conf["GresTypes"] == "gpu"
    first, last = map(int, re.search(r"File=/dev/nvidia\[(\d+)-(\d+)\]", rendered["gres.conf"]).groups())
    assert last - first + 1 == gpus
    assert partition["Default"] == "YES"  # deploy/slurm/*.sbatch name no partition
    # the controller: its host name is SlurmctldHost's, and the nodes fetch the configuration from it
    host = re.search(r"^hostnamectl set-hostname (\S+)", rendered["controller.sh"], re.M)[1]
    assert conf["SlurmctldHost"] == f"{host}({cluster['controller_ip']})"
    assert "enable_configless" in conf["SlurmctldParameters"]
    assert f"--conf-server {cluster['controller_ip']} -N {cluster['prefix']}1" in rendered["gpu-node.sh"]
    # the health check is the repository's, where the image puts deploy/ and the node copies it out
    workdir = re.search(r"^WORKDIR (\S+)$", DOCKERFILE.read_text(encoding="utf-8"), re.M)[1]
    assert re.search(r"^COPY deploy \./deploy$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert f'docker cp "$container:{workdir}/deploy"' in rendered["gpu-node.sh"]
    health = Path(conf["HealthCheckProgram"])
    assert (REPO / health.relative_to(workdir)).is_file()
    command = re.search(r'value\s*=\s*"(cd /shared && sbatch .*)"', (TERRAFORM / "outputs.tf").read_text())[1]
    assert (REPO / Path(re.search(r" (/\S+\.sbatch) ", command)[1]).relative_to(workdir)).is_file()


@pytest.mark.parametrize("gpu_type", ["h100", "h200"])
def test_the_nodes_health_check_settings_are_ones_healthcheck_sh_reads(gpu_type):
    script = _rendered(gpu_type)["gpu-node.sh"]
    settings = dict(
        line.split("=", 1) for line in _heredoc(script, "/etc/gpuval/healthcheck.conf").splitlines()
    )
    known = re.search(r"^\s+(GPUVAL_PROFILE \| [A-Z_ |]+)\)$", (SLURM / "healthcheck.sh").read_text(), re.M)[
        1
    ]
    assert set(settings) <= set(known.replace(" ", "").split("|"))
    profile = load_profile(settings["GPUVAL_PROFILE"])  # the profile judges this GPU type: it must exist
    assert profile.expect.gpu_count == _gpu_types()[gpu_type]["gpus_per_node"]
    assert _heredoc(script, settings["GPUVAL_PYTHON"]).startswith("#!/bin/bash\n")  # the wrapper is written
    assert f"export GPUVAL_PYTHON={settings['GPUVAL_PYTHON']}" in _heredoc(script, "/etc/profile.d/gpuval.sh")


def test_the_user_data_scripts_and_the_wrapper_pass_bash_n_and_shellcheck(tmp_path):
    files = []
    for gpu_type in ("h100", "h200"):
        rendered = _rendered(gpu_type)
        for name in ("controller.sh", "gpu-node.sh"):
            files.append(tmp_path / f"{gpu_type}-{name}")
            files[-1].write_text(rendered[name], encoding="utf-8")
        files.append(tmp_path / f"{gpu_type}-python")
        files[-1].write_text(_heredoc(rendered["gpu-node.sh"], "/opt/gpuval/bin/python"), encoding="utf-8")
    for path in files:
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{path.name}: {syntax.stderr}"
    proc = subprocess.run([_tool("shellcheck"), *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the gpuval wrapper on the GPU nodes (/opt/gpuval/bin/python), against a fake docker -----------------

FAKE_DOCKER = """#!/bin/bash
# records what the wrapper asks of docker; `run` exits $FAKE_STATUS or, with FAKE_SLEEP, runs until `kill`
case $1 in
run)
  printf '%s\\0' "$@" >"$FAKE_LOG.run"
  cat >"$FAKE_LOG.stdin"
  if [ -n "${FAKE_SLEEP:-}" ]; then
    trap 'kill $! 2>/dev/null; exit 42' TERM
    echo $$ >"$FAKE_LOG.pid"
    sleep 30 &
    wait $!
  fi
  exit "${FAKE_STATUS:-0}"
  ;;
kill)
  printf '%s\\0' "$@" >"$FAKE_LOG.kill"
  kill -TERM "$(cat "$FAKE_LOG.pid")"
  ;;
esac
"""


def _wrapper(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The wrapper as the node script writes it (its image file moved under tmp_path), and an environment
    with the fake docker first on PATH and a Slurm task's variables."""
    text = _heredoc(_rendered("h100")["gpu-node.sh"], "/opt/gpuval/bin/python")
    (tmp_path / "image").write_text("ghcr.io/example/gpuval:0.1.0\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(text.replace("/opt/gpuval/image", str(tmp_path / "image")), encoding="utf-8")
    wrapper.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "FAKE_LOG": str(tmp_path / "docker"),
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "NCCL_DEBUG": "WARN",
        "GPUVAL_PROFILE": "h100-sxm",
        "AWS_SECRET_ACCESS_KEY": "not-for-the-container",
    }
    return wrapper, env


def test_the_wrapper_gives_the_container_the_task_its_input_and_returns_its_exit_code(tmp_path):
    wrapper, env = _wrapper(tmp_path)
    script = "import json\n"  # healthcheck.sh pipes its reason-printing script to `python -`
    proc = subprocess.run(
        [str(wrapper), "-", "/tmp/result.json"],
        input=script,
        capture_output=True,
        text=True,
        env={**env, "FAKE_STATUS": "3"},
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 3, proc.stderr  # gpuval's ERROR reaches healthcheck.sh as it is
    args = (tmp_path / "docker.run").read_text().split("\0")[:-1]
    assert (tmp_path / "docker.stdin").read_text() == script
    passed = {args[i + 1] for i, arg in enumerate(args) if arg == "-e"}
    assert {"SLURM_JOB_ID", "SLURM_PROCID", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "GPUVAL_PROFILE"} <= passed
    assert "AWS_SECRET_ACCESS_KEY" not in passed and "PATH" not in passed
    assert {"--gpus", "--network", "--ipc"} <= set(args) and args[args.index("--gpus") + 1] == "all"
    assert args[args.index("--name") + 1].startswith("gpuval-7.0.3-")
    assert f"{tmp_path}:{tmp_path}" in args and args[args.index("-w") + 1] == str(tmp_path)
    image = args.index("ghcr.io/example/gpuval:0.1.0")
    assert args[image + 3 :] == ["python", "-", "/tmp/result.json"]


def test_a_signal_to_the_wrapper_stops_its_container_and_its_exit_code_comes_back(tmp_path):
    """srun's TERM reaches the wrapper, not the container dockerd started: the wrapper kills the container
    by name and returns the container's own exit status."""
    wrapper, env = _wrapper(tmp_path)
    proc = subprocess.Popen(
        [str(wrapper), "-m", "gpuval", "health"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**env, "FAKE_SLEEP": "1"},
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 20
    while not (tmp_path / "docker.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 42  # the container's status, not the signal's 143
    kill = (tmp_path / "docker.kill").read_text().split("\0")[:-1]
    assert kill[:3] == ["kill", "--signal", "TERM"] and kill[3].startswith("gpuval-7.0.3-")
