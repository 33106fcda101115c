"""The ranks' errors, said once in one line by gpuval's own launcher (launch.launch_local).

A rank that the launcher started does not print its error: it leaves it in the launcher's exit folder
(`report_error`), and the launcher, once the ranks ended, says every rank's error in one `gpuval:` line
(`gathered_line`): each distinct error once with the ranks that met it, the first said first, ranks that
only lost their peers last. Under someone else's torchrun or srun there is no exit folder and a rank
says its own line, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from gpuval.errors import EXIT_ERROR

EXIT_DIR_VARIABLE = "GPUVAL_EXIT_DIR"  # the launcher's exit folder, in every rank it started
LINE_SUFFIX = ".line"  # a rank's one-line error in it: RANK.line
DECIDED = "decided"  # written by the rank that ended the run on a deadline (gpuval.deadline): named ranks
ENDED_PREFIX = "ended-"  # ended-RANK: another rank killed that stopped rank and said so in its own line


def report_error(line: str, lost: bool = False) -> bool:
    """In a worker started by launch_local: leave this rank's one-line error for the launcher, which says
    every rank's once, gathered (`gathered_line`); False elsewhere, where the rank says it itself. A
    rank's first error is kept (what came after it, such as losing its peers, is its consequence), with
    when it was said; `lost`: the error is the rank's peers gone silent, said after the errors that
    caused it. Written before the rank reports its exit code, which the launcher's watchdog acts on."""
    exit_dir = os.environ.get(EXIT_DIR_VARIABLE)
    if not exit_dir:
        return False
    path = Path(exit_dir) / f"{os.environ.get('RANK', '0')}{LINE_SUFFIX}"
    if path.exists():
        return True
    try:
        path.with_suffix(".tmp").write_text(
            json.dumps({"line": line, "lost": lost, "at": time.time()}), encoding="utf-8"
        )
        path.with_suffix(".tmp").replace(path)
    except OSError:
        return False
    return True


def errors_said(exit_dir: Path) -> dict[int, tuple[str, bool, float]]:
    """The ranks' errors (report_error): rank -> (line, whether it is a lost peer, when it was said)."""
    said = {}
    with contextlib.suppress(OSError):
        for path in exit_dir.iterdir():
            rank = path.name.removesuffix(LINE_SUFFIX)
            if path.name.endswith(LINE_SUFFIX) and rank.isdigit():
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    entry = json.loads(path.read_text(encoding="utf-8"))
                    said[int(rank)] = (str(entry["line"]), bool(entry["lost"]), float(entry["at"]))
    return said


MAX_GATHERED = 3  # distinct errors a gathered line spells out; the rest are counted


def gathered_line(said: dict[int, tuple[str, bool, float]], world: int) -> str:
    """The ranks' errors in one line: an error every rank met, once, as it is; else each distinct error
    once with the ranks that met it ("ranks 0-3, 6 of 8: ..."), the first said first (what broke a
    collective comes before what the other ranks then met in it), the first MAX_GATHERED of them and a
    count of the rest. Ranks that only lost their peers come last, in a few words, when another rank
    said what went wrong. "" when no rank said anything."""
    causes = [rank for rank, (_, lost, _) in said.items() if not lost]
    lost = sorted(rank for rank, (_, gone, _) in said.items() if gone) if causes else []
    by_error: dict[str, list[int]] = {}
    for rank in sorted(causes or said, key=lambda r: (said[r][2], r)):
        by_error.setdefault(" ".join(said[rank][0].split()), []).append(rank)
    for ranks in by_error.values():
        ranks.sort()
    if len(by_error) == 1 and len(said) == world and not lost:
        return next(iter(by_error))
    parts = [f"{ranks_text(ranks)} of {world}: {error}" for error, ranks in by_error.items()]
    if len(parts) > MAX_GATHERED:
        rest = sum(len(ranks) for ranks in list(by_error.values())[MAX_GATHERED:])
        parts = [*parts[:MAX_GATHERED], f"{len(parts) - MAX_GATHERED} other errors on {rest} more ranks"]
    line = "; ".join(parts)
    return f"{line} ({ranks_text(lost)} of {world} then lost contact)" if lost else line


def ranks_text(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-3, 6': sorted ranks, runs of three or more as a range."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    shown = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def ended_with(
    codes: dict[int, int], said: dict[int, tuple[str, bool, float]], world: int
) -> tuple[int, str]:
    """The exit code and the one line of a run whose ranks all ended and some said an error: rank 0's
    code where it reported one that is not a pass (its verdict: a FAIL outranks an error another rank
    met), else the worst code of the ranks that spoke, and never a pass (ERROR where they exited 0)."""
    line = gathered_line(said, world)
    if codes.get(0):
        return codes[0], line
    worst = max((codes.get(rank, EXIT_ERROR) for rank in said), default=EXIT_ERROR)
    return worst or EXIT_ERROR, line


def mark_decided(ranks: list[int]) -> None:
    """In a worker started by launch_local: the run ends on a deadline, this rank said so in one line, and
    `ranks` are the ones named (the launcher stops them at once and adds no line of its own)."""
    exit_dir = os.environ.get(EXIT_DIR_VARIABLE)
    if exit_dir:
        with contextlib.suppress(OSError):
            path = Path(exit_dir) / DECIDED
            path.with_suffix(".tmp").write_text(json.dumps(sorted(ranks)))
            path.with_suffix(".tmp").replace(path)


def mark_ended(rank: int) -> None:
    """In a worker started by launch_local: this rank killed `rank` (stopped by a signal while the group
    formed, runtime._end_stopped_peers) and says so in its own line, which the launcher then prints alone."""
    exit_dir = os.environ.get(EXIT_DIR_VARIABLE)
    if exit_dir:
        with contextlib.suppress(OSError):
            (Path(exit_dir) / f"{ENDED_PREFIX}{rank}").write_text("")


def report_exit(code: int) -> int:
    """In a worker started by launch_local: leave the exit code for the parent, and exit 0 to the agent."""
    exit_dir = os.environ.get(EXIT_DIR_VARIABLE)
    if not exit_dir:
        return code
    rank = os.environ.get("RANK", "0")
    (Path(exit_dir) / rank).write_text(str(code))
    return 0
