"""How much of a result the reports show, so that any result renders in seconds and reads on one screen.

A result file may be a 1,000-node run's (8,000 GPUs, 250,000 checks) or hold what gpuval never writes
(a 5 MB scope, 600 soak series); `report` and `compare` show the part a person reads, say what they left
out and where it is (result.json, `compare --json`), and never cut what they judge: every check still
counts in the verdict, every row in `compare --json` and its exit code. The caps are far above what one
node's run holds, so an ordinary report shows everything as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

MAX_TEXT = 160  # characters of a name, scope, label or table cell
MAX_DETAIL = 2000  # characters of a check's "why / what to do"
MAX_ROWS = 1000  # rows of a table (checks, nodes, iterations, compared measurements)
MAX_BARS = 64  # GPUs drawn as labelled bars; more are drawn as one sorted line
MAX_MATRICES = 4  # nodes' P2P matrices drawn: those with the weakest link
MAX_CELL_TEXT_GPUS = 16  # a P2P matrix writes its figures in its cells up to this many GPUs
MAX_PANELS = 12  # soak panels (one per judged name): the failing ones first
MAX_LINES = 8  # soak series per panel: the failing ones first

T = TypeVar("T")


def cut(text: object, limit: int = MAX_TEXT) -> str:
    """`text` as a string of at most `limit` characters, the cut marked with an ellipsis."""
    shown = str(text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def more(left_out: int, noun: str, where: str) -> str:
    """The line under a capped table or plot: how many were left out and where every one is."""
    return f"{left_out:,} more {noun} not shown: {where}"


def capped(items: Sequence[T], limit: int) -> tuple[Sequence[T], int]:
    """The first `limit` of `items` and how many are left out."""
    return items[:limit], max(0, len(items) - limit)
