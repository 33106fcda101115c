"""Process-group set-up from the launcher's environment: torchrun (and so Kubernetes), Slurm, or none.

gpuval never launches or connects ranks itself: torchrun/srun start the processes, torch.distributed
(NCCL on GPUs, gloo on CPUs) connects them. Every collective runs under the process group's timeout.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gpuval.errors import GpuvalError, LostPeers, RunError, UsageError, one_line
from gpuval.scope import Scope

DEFAULT_TIMEOUT_S = 300.0
# The process group's forming (the join: every rank's store exchange, NCCL's communicator init where a GPU
# is bound) and its first collective are a phase of their own: a rank that stops or never arrives there
# must end the run well before the profile's collective timeout (issue 51). Its pessimistic plan is the
# slowest rank's start after the first (its imports) plus the communicator's init; its deadline that plus
# the phases' margin (gpuval.deadline.deadline_s), never more than the profile's timeout. Measured joins:
# docs/deadlines.md.
JOIN_EXPECTED_S = 10.0
_ARRIVED = "gpuval/join/"  # key prefix in the launcher's store: a rank about to join says so


@dataclass
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node_name: str
    backend: str
    device: Any  # torch.device
    launcher: str  # "single" | "torchrun" | "slurm"
    timeout_s: float
    node_names: list[str] = field(default_factory=list)  # index = node_rank
    join_s: float | None = None  # seconds the process group took to form, its first collective included
    _host_group: Any = field(default=None, repr=False)  # gloo group for host_barrier, made on first use

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, len(self.node_names))

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def node_scope(self) -> str:
        """This rank's node as a check scope: 'node:NODE'."""
        return str(Scope.of_node(self.node_name))

    @property
    def device_scope(self) -> str:
        """This rank's device as a check scope: 'gpu:NODE/INDEX' with the node's own GPU numbering (what
        nvidia-smi and gpuval health call it, also when CUDA_VISIBLE_DEVICES renumbers), 'cpu:NODE/RANK'."""
        if not self.on_gpu:
            return str(Scope.cpu(self.node_name, self.local_rank))
        visible = [
            part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()
        ]
        index = self.device.index
        if index < len(visible) and visible[index].isdigit():
            index = int(visible[index])
        return str(Scope.gpu(self.node_name, index))

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.on_gpu:
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def host_barrier(self) -> None:
        """Wait for every rank without touching a GPU (gloo over the same rendezvous).

        An NCCL barrier is a kernel that spins on the waiting GPU; while one rank measures GPU-to-GPU
        copies, that spinning kernel on the destination GPU cut gpu0->gpu1 copies to a third
        (benchmarks/results/2026-11-21-h200x2-accept/, against 2026-11-21-h200x2-p2p-host-barrier/).
        """
        import torch.distributed as dist

        if not self.on_gpu:
            dist.barrier()
            return
        if self._host_group is None:
            self._host_group = dist.new_group(backend="gloo")
        dist.barrier(group=self._host_group)

    def local_turns(self) -> Iterator[bool]:
        """For work that must not share what a node's GPUs share (host memory, the CPU's PCIe root):
        yields once per local rank, True on this rank's turn, with a host barrier between turns. One
        rank per node works at a time; nodes work at the same time. Every rank must iterate it all."""
        turns = max(self.all_gather_object(self.local_world_size))
        for turn in range(turns):
            self.host_barrier()
            yield turn == self.local_rank
        self.host_barrier()

    def all_gather_object(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, obj)
        except RuntimeError as exc:  # DistBackendError: a peer died (connection closed) or timed out
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LostPeers(f"rank {self.rank} lost contact with the other ranks: {first}") from None
        return gathered

    def synchronize(self) -> None:
        if self.on_gpu:
            import torch

            torch.cuda.synchronize(self.device)

    def world_info(self) -> dict[str, Any]:
        return {"size": self.world_size, "nodes": self.num_nodes, "backend": self.backend}

    def shutdown(self) -> None:
        """Leave the process group. Every rank calls it on its way out, after its last collective.

        torch 2.13's DistributedDataParallel keeps Python references to the default group after it is
        gone (10 of them, measured with a two-rank gloo run), so `destroy_process_group` does not free
        it: the group's threads live on into interpreter finalization, where a thread that takes the
        GIL aborts the process ("terminate called without an active exception", pytorch#179291).
        `leave_process` therefore ends a rank that had peers without finalization.

        Called on the way out of an error gpuval foresaw (from a `finally`), it first leaves that error
        for gpuval's launcher to say (rank_lines.report_error): leaving the group breaks the collectives the
        other ranks are in, and what they then meet must not be said as if it came first.
        """
        import gc

        import torch.distributed as dist

        from gpuval.rank_lines import report_error

        leaving_on = sys.exc_info()[1]
        if isinstance(leaving_on, GpuvalError):
            report_error(one_line(str(leaving_on)), lost=isinstance(leaving_on, LostPeers))
        global _HAD_PEERS
        if dist.is_initialized():
            _HAD_PEERS = _HAD_PEERS or self.world_size > 1
            gc.collect()  # collectives' Work objects caught in cycles go now, while Python is alive
            dist.destroy_process_group()


_HAD_PEERS = False  # this process was one rank of several: see Runtime.shutdown and leave_process


def leave_process(code: int) -> None:
    """Exit with `code`. A rank that had peers flushes its output and exits without interpreter
    finalization (Runtime.shutdown says why); everything it writes is closed by then (atomic.py). The
    stopped ranks it said it would end (_end_stopped_peers) go now."""
    if _PEERS_TO_END:
        import signal

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for pid in _PEERS_TO_END:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    if not _HAD_PEERS:
        sys.exit(code)
    import logging

    from gpuval.exiting import flush_and_exit

    logging.shutdown()
    flush_and_exit(code)


def launcher_env(environ: dict[str, str] | None = None) -> str:
    """Which launcher started this process: 'torchrun', 'slurm' (srun, one task per GPU) or 'single'."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_STEP_ID" in env:
        return "slurm"
    return "single"


def _slurm_master_addr(env: dict[str, str]) -> str:
    # srun runs the batch step on the first node of the allocation, so the launch node is rank 0's node.
    if env.get("SLURM_LAUNCH_NODE_IPADDR"):
        return env["SLURM_LAUNCH_NODE_IPADDR"]
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
        ).stdout.split()
        return hosts[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "127.0.0.1"


def distributed_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Rank layout from the environment only: RANK/WORLD_SIZE/... (torchrun) or SLURM_* (srun)."""
    env = dict(os.environ if environ is None else environ)
    kind = launcher_env(env)
    if kind == "torchrun":
        world = int(env["WORLD_SIZE"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        return _layout(
            kind,
            rank=int(env["RANK"]),
            world_size=world,
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=local_world,
            node_rank=int(env.get("GROUP_RANK", int(env["RANK"]) // max(local_world, 1))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=env.get("MASTER_PORT", "29500"),
        )
    if kind == "slurm":
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_NNODES", "1"))
        tasks_per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        job_id = int(env.get("SLURM_JOB_ID", "0") or 0)
        return _layout(
            kind,
            rank=int(env["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=int(tasks_per_node) if tasks_per_node.isdigit() else max(1, world // nodes),
            node_rank=int(env.get("SLURM_NODEID", 0)),
            master_addr=env.get("MASTER_ADDR") or _slurm_master_addr(env),
            # One port per job, so two jobs sharing a node do not collide.
            master_port=env.get("MASTER_PORT") or str(20000 + job_id % 20000),
        )
    return _layout(kind)


def _layout(
    launcher: str,
    rank: int = 0,
    world_size: int = 1,
    local_rank: int = 0,
    local_world_size: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: str = "0",
) -> dict[str, Any]:
    """The rank layout as distributed_env returns it (defaults: one process started by hand)."""
    return {
        "launcher": launcher,
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "local_world_size": local_world_size,
        "node_rank": node_rank,
        "master_addr": master_addr,
        "master_port": master_port,
    }


def node_name(environ: dict[str, str] | None = None) -> str:
    """This node's name: GPUVAL_NODE_NAME, else Slurm's SLURMD_NODENAME, else the host name. One that could
    not name a node in a scope (a '/' in GPUVAL_NODE_NAME) is a one-line UsageError naming its source."""
    from gpuval.scope import node_name_problem

    env = os.environ if environ is None else environ
    for source in ("GPUVAL_NODE_NAME", "SLURMD_NODENAME"):
        if env.get(source):
            name = env[source]
            break
    else:
        source, name = "the host name", socket.gethostname()
    if problem := node_name_problem(name):
        raise UsageError(f"{source} {name!r}: {problem}; set GPUVAL_NODE_NAME to the node's host name")
    return name


def gpu_index(local_rank: int, visible: int) -> int:
    """This rank's GPU: its local rank, or the only GPU it sees when the launcher bound one GPU to each
    task (srun --gpus-per-task=1, Kubernetes with one GPU per container)."""
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    raise RunError(
        f"local rank {local_rank} has no GPU: {visible} visible to it; start one process per GPU "
        "(torchrun --nproc-per-node=<GPUs>, or srun --gpus-per-task=1)"
    )


def init_runtime(
    timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None, log_dir: str | os.PathLike | None = None
) -> Runtime:
    """Join the process group the launcher prepared (or a group of one), bound to this rank's GPU.

    `log_dir`: the run's output folder; NCCL's debug output and PyTorch's flight-recorder dumps go there
    (quiet.route_nccl_output), never to the console, unless the user pointed them elsewhere."""
    import torch
    import torch.distributed as dist

    layout = distributed_env()
    if layout["launcher"] != "single":
        import faulthandler

        faulthandler.enable()  # a rank that dies on a signal prints its Python stack first
    if torch.cuda.is_available() and backend != "gloo":
        device = torch.device("cuda", gpu_index(layout["local_rank"], torch.cuda.device_count()))
        torch.cuda.set_device(device)
        backend = backend or "nccl"
        if log_dir is not None:
            from gpuval.quiet import route_nccl_output

            route_nccl_output(log_dir, layout["rank"])
    else:
        device = torch.device("cpu")
        backend = backend or "gloo"

    join_s = join_deadline_s(timeout_s)
    timeout = timedelta(seconds=join_s)
    began = time.monotonic()
    try:
        if not dist.is_initialized():
            if layout["launcher"] == "single":
                dist.init_process_group(  # nothing to wait for: the profile's timeout
                    backend,
                    store=dist.HashStore(),
                    rank=0,
                    world_size=1,
                    timeout=timedelta(seconds=timeout_s),
                )
            else:
                os.environ.setdefault("MASTER_ADDR", str(layout["master_addr"]))
                os.environ.setdefault("MASTER_PORT", str(layout["master_port"]))
                _say_arrived(layout)
                kwargs: dict[str, Any] = {}
                if device.type == "cuda":
                    kwargs["device_id"] = device  # binds NCCL to this GPU, connects eagerly
                dist.init_process_group(
                    backend,
                    init_method="env://",
                    rank=layout["rank"],
                    world_size=layout["world_size"],
                    timeout=timeout,
                    **kwargs,
                )
    except (RuntimeError, ValueError, OSError) as exc:
        where = f"{backend}, rank {layout['rank']} of {layout['world_size']}, join {_within(began, join_s)}"
        raise RunError(
            f"could not join the process group ({where}{_not_arrived(layout)}): {_first_line(exc)}"
            f"{_end_stopped_peers(layout)}"
        ) from None

    runtime = Runtime(
        rank=layout["rank"],
        world_size=layout["world_size"],
        local_rank=layout["local_rank"],
        local_world_size=layout["local_world_size"],
        node_rank=layout["node_rank"],
        node_name=node_name(),
        backend=backend,
        device=device,
        launcher=layout["launcher"],
        timeout_s=timeout_s,
    )
    try:  # the group's first collective, still under the join's deadline
        pairs = runtime.all_gather_object((runtime.node_rank, runtime.node_name))
    except LostPeers as exc:
        raise LostPeers(
            f"the process group formed but its first collective did not complete ({backend}, rank "
            f"{runtime.rank} of {runtime.world_size}, first collective {_within(began, join_s)}): {exc}"
            f"{_end_stopped_peers(layout)}"
        ) from None
    names: dict[int, str] = {}
    for rank_node, name in pairs:
        names.setdefault(rank_node, name)
    runtime.node_names = [names[index] for index in sorted(names)]
    runtime.join_s = round(time.monotonic() - began, 3)
    if runtime.world_size > 1 and join_s < timeout_s:
        from gpuval.deadline import _set_timeout

        _set_timeout(runtime, timeout_s)  # from now on, the profile's (and each phase's, gpuval.deadline)
    return runtime


def join_deadline_s(timeout_s: float) -> float:
    """Seconds the process group may take to form, its first collective included (JOIN_EXPECTED_S)."""
    from gpuval.deadline import deadline_s

    return min(timeout_s, deadline_s(JOIN_EXPECTED_S))


def _within(began: float, deadline: float) -> str:
    """'after 40 s of the 40 s allowed': how long a step of the join took before it failed."""
    return f"after {time.monotonic() - began:.0f} s of the {deadline:.0f} s allowed"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _agent_store(timeout_s: float) -> Any:
    """A client of the store that torchrun's agent (gpuval's own launcher's too) hosts before any rank
    starts; None where there is none yet (srun: rank 0's join makes it)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def _arrived_key(rank: int) -> str:
    return f"{_ARRIVED}{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"


def _say_arrived(layout: dict[str, Any]) -> None:
    """Before joining, say so in the launcher's store, so that a join that times out can name the ranks
    that never came (best effort: a store that cannot be reached only loses that naming)."""
    try:
        store = _agent_store(5.0)
        if store is not None:
            store.set(_arrived_key(layout["rank"]), f"{socket.gethostname()} {os.getpid()}")
    except Exception:  # noqa: BLE001 (the join itself says what is wrong with the store)
        pass


def _not_arrived(layout: dict[str, Any]) -> str:
    """'; ranks 1, 3 never started joining' after a join that failed, where the launcher's store can tell."""
    try:
        store = _agent_store(2.0)
        if store is None:
            return ""
        missing = [r for r in range(layout["world_size"]) if not store.check([_arrived_key(r)])]
    except Exception:  # noqa: BLE001
        return ""
    if not missing:
        return "; every rank started joining, so one stopped or hung inside it"
    from gpuval.rank_lines import ranks_text

    return f"; {ranks_text(missing)} never started joining"


_PEERS_TO_END: list[int] = []  # pids of stopped ranks this rank kills as it leaves (leave_process)


def _end_stopped_peers(layout: dict[str, Any]) -> str:
    """After a join or first collective that failed: the ranks on this host that said they were joining and
    are now stopped by a signal get SIGKILL when this rank leaves, after its line and its result files (a
    stopped process obeys no other signal, and torchrun's agent waits 30 s between its SIGTERM and SIGKILL;
    killed sooner, the agent would see that rank die and stop this one before it said anything), as
    gpuval.deadline does to silent ranks once the group runs. Returns '; rank 1 (stopped by a signal),
    stopped by gpuval' for the line, or ''."""
    from gpuval.procstate import STATES, STOPPED, is_gpuval, state
    from gpuval.rank_lines import mark_ended

    try:
        store = _agent_store(2.0)
        if store is None:
            return ""
        here, ended = socket.gethostname(), []
        for rank in range(layout["world_size"]):
            if rank == layout["rank"] or not store.check([_arrived_key(rank)]):
                continue
            host, _, pid_text = store.get(_arrived_key(rank)).decode().partition(" ")
            pid = int(pid_text) if pid_text.isdigit() else 0
            if host == here and pid and state(pid) in STOPPED and is_gpuval(pid):
                mark_ended(rank)
                _PEERS_TO_END.append(pid)
                ended.append(rank)
    except Exception:  # noqa: BLE001 (best effort: the launcher's own watch still ends them)
        return ""
    return "".join(f"; rank {rank} ({STATES['T']}), stopped by gpuval" for rank in ended)
