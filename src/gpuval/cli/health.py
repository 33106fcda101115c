"""`gpuval health`: this node's GPUs, links and driver in seconds (every node's under torchrun/srun)."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from gpuval import launch
from gpuval.cli.options import (
    HealthOutputOption,
    JsonResultOption,
    ProfileOption,
    SetOption,
    TextfileOption,
    console,
    default_result_dir,
    exits,
    is_first_rank,
    say_written,
)
from gpuval.errors import EXIT_ERROR, EXIT_FAIL, EXIT_PASS


@exits
def health(
    profile: ProfileOption = None,
    set_: SetOption = [],  # noqa: B006 - typer reads the default, never mutates it
    output: HealthOutputOption = None,
    json_: JsonResultOption = False,
    textfile: TextfileOption = None,
) -> int:
    """Check this node's GPUs, links and driver in seconds; exit 0 PASS, 1 FAIL, 2 bad input, 3 ERROR."""
    from gpuval.accept import write_reports
    from gpuval.atomic import ensure_writable_dir
    from gpuval.config import load_profile, pick_profile
    from gpuval.discover.pci import nvidia_gpus
    from gpuval.health.run import families, health_result, node_health
    from gpuval.history import history_path_from
    from gpuval.nvml import available, snapshot
    from gpuval.report.console import print_result
    from gpuval.results import World
    from gpuval.runtime import launcher_env, node_name
    from gpuval.textfile import published

    started_at, began = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.perf_counter()
    nvml = snapshot()  # read once: it picks the profile (as discover.local_gpu_names would) and is judged
    names = [gpu.name for gpu in nvml.gpus if available(gpu.name)]
    loaded = load_profile(profile or pick_profile(names, [gpu.pci_id for gpu in nvidia_gpus()]), set_)
    families(loaded)  # an unknown name in health.skip is bad input: say so before any work
    node = node_name()  # a name no scope can hold is bad input: said before any folder is made
    if output is None:
        output = default_result_dir("health")
    if is_first_rank():
        ensure_writable_dir(output)
        if textfile is not None:
            ensure_writable_dir(textfile, "--textfile")
    history = history_path_from(None)  # read only: accept's last passing run there bounds the XID window

    def report(result) -> int:
        result, paths = write_reports(result, output)  # result.json last: ERROR if a report failed
        if json_:
            sys.stdout.write(result.to_json())
        else:
            where = node if result.world.nodes == 1 else f"{result.world.nodes} nodes"
            print_result(result, console, title=f"gpuval health · {where} · profile {loaded.name}")
            say_written(paths)
        return {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL}.get(result.verdict.value, EXIT_ERROR)

    # once the run ended, however it ended, rank 0 writes the textfile: every node's health under a launcher
    writer = textfile if is_first_rank() else None
    began_at = datetime.fromisoformat(started_at)
    if launcher_env() == "single":  # one node, one process: no process group needed
        with published(writer, "health", output, loaded.name, began_at):
            checks = node_health(loaded, node, snapshot=nvml, history=history)
            return report(health_result(loaded, node, checks, nvml, started_at, time.perf_counter() - began))

    def across_nodes() -> int:  # under torchrun/srun: every node's health, SDC on every rank, fleet checks
        from gpuval.accept import run_health_phase
        from gpuval.runtime import init_runtime

        runtime = init_runtime(timeout_s=loaded.runtime.timeout_s)
        try:
            nodes, checks = run_health_phase(runtime, loaded, command="health", history=history)
            world = World.model_validate(runtime.world_info())
        finally:
            runtime.shutdown()
        if not runtime.is_main:
            return EXIT_PASS
        duration_s = time.perf_counter() - began
        return report(health_result(loaded, node, checks, None, started_at, duration_s, nodes, world))

    with published(writer, "health", output, loaded.name, began_at):
        return launch.run_distributed(None, across_nodes, timeout_s=loaded.runtime.timeout_s)
