"""Pairs of nodes: which pairs run together (a round-robin schedule), and which node or link the pairs'
figures blame. Pure functions, no torch: the collectives benchmark runs the schedule, gpuval.derived.outliers
turns the attribution into 'outliers' measurements that checks.py judges.

Schedule: the circle method of round-robin tournaments (one entrant fixed, the others rotated one place
per round; an odd count adds a "bye"). N nodes meet in N-1 rounds (N rounds for odd N, each node idle
once), every pair exactly once, and the pairs of a round share no node, so they run at the same time.

Attribution, from one figure per pair (busbw, higher is better), with no bound of its own: each suspect
gets a gap, how far it sits below what its peers reach, in % (0 when it is not below), and the check's
bound (outliers.collectives_pct) decides.
- node X: its *fastest* pair against the median of the pairs without X. Every pair of a slow node is
  slow, so even its fastest one is far below; a node with one slow link still has fast pairs.
- link A+B: the pair against the lower of A's and B's medians with their other nodes. A slow link sits
  below both nodes' other pairs; a pair of a slow node does not (that node's other pairs are as slow).
  What is left is the scatter among a slow node's pairs (wide where the node is starved of CPU), so a
  link whose own node sits at least as far below is explained by that node, gap 0: a slow node is never
  blamed on its links, a link far slower than its slow node still is. Only each node's slowest
  pair is a candidate (a slow link is always one of them): one row per node at most, not N(N-1)/2.
Median references are taken without the suspect's own pairs: at N=4 half of all pairs contain any one
node, and a median over them would sink with the slow node. Like any median rule it assumes most nodes
and links are fine; with three nodes a slow node shows, a slightly slow one may not.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from gpuval.scope import Scope

T = TypeVar("T")
Pair = tuple[str, str]


def round_robin(entrants: Sequence[T]) -> list[list[tuple[T, T]]]:
    """Rounds of disjoint pairs, every pair of `entrants` exactly once (circle method).

    Each pair keeps the entrants' order (first-listed first); an entrant with a bye sits the round out.
    """
    slots: list[T | None] = list(entrants)
    if len(slots) < 2:
        return []
    if len(slots) % 2:
        slots.append(None)  # the bye: whoever meets it sits the round out
    order = {entrant: index for index, entrant in enumerate(entrants)}
    half = len(slots) // 2
    rounds = []
    for _ in range(len(slots) - 1):
        pairs = []
        for a, b in zip(slots[:half], reversed(slots[half:]), strict=True):
            if a is not None and b is not None:
                pairs.append((a, b) if order[a] < order[b] else (b, a))
        rounds.append(pairs)
        slots = [slots[0], slots[-1], *slots[1:-1]]  # the first stays, the others move one place
    return rounds


def pair_scope(a: str, b: str) -> str:
    """The scope of a measurement made across nodes a and b."""
    return str(Scope.pair(a, b))


@dataclass(frozen=True)
class Suspect:
    """A node or a link, and how far its pairs sit below its peers."""

    kind: Literal["node", "link"]
    nodes: tuple[str, ...]  # (X,) or (A, B)
    value: float  # node: its fastest pair; link: the pair's figure
    reference: float  # node: median of the pairs without it; link: the lower of its nodes' other medians
    gap_pct: float  # (reference - value) / reference in %, 0 when value is not below
    median: float  # node: median of its pairs; link: A's other pairs' median
    other_median: float  # node: = reference; link: B's other pairs' median
    pairs: int  # node: its pairs; link: 1
    peers: int  # pairs the reference is the median of (for a link: A's others + B's others)
    explained_by: str | None = None  # link: the node of the two that sits at least as far below

    @property
    def scope(self) -> str:
        return str(Scope.of_node(self.nodes[0])) if self.kind == "node" else pair_scope(*self.nodes)


def _gap_pct(value: float, reference: float) -> float:
    return max(0.0, (reference - value) / reference * 100.0) if reference > 0 else 0.0


def attribute(figures: Mapping[Pair, float]) -> list[Suspect]:
    """Every node and each node's slowest pair as suspects, worst gap first; empty below three nodes
    (one pair has no peers to be compared with)."""
    nodes = sorted({node for pair in figures for node in pair})
    if len(nodes) < 3:
        return []
    with_node = {node: {pair: v for pair, v in figures.items() if node in pair} for node in nodes}
    suspects: list[Suspect] = []
    for node in nodes:
        mine = list(with_node[node].values())
        others = [v for pair, v in figures.items() if node not in pair]
        reference = statistics.median(others)
        suspects.append(
            Suspect(
                kind="node",
                nodes=(node,),
                value=max(mine),
                reference=reference,
                gap_pct=_gap_pct(max(mine), reference),
                median=statistics.median(mine),
                other_median=reference,
                pairs=len(mine),
                peers=len(others),
            )
        )
    slowest = sorted({min(with_node[node], key=lambda pair: (with_node[node][pair], pair)) for node in nodes})
    for a, b in slowest:
        value = figures[(a, b)]
        a_others = [v for pair, v in with_node[a].items() if pair != (a, b)]
        b_others = [v for pair, v in with_node[b].items() if pair != (a, b)]
        a_median, b_median = statistics.median(a_others), statistics.median(b_others)
        reference = min(a_median, b_median)
        gap = _gap_pct(value, reference)
        slower = max(
            (s for s in suspects if s.kind == "node" and s.nodes[0] in (a, b)), key=lambda s: s.gap_pct
        )
        explained = gap > 0 and slower.gap_pct >= gap
        suspects.append(
            Suspect(
                kind="link",
                nodes=(a, b),
                value=value,
                reference=reference,
                gap_pct=0.0 if explained else gap,
                median=a_median,
                other_median=b_median,
                pairs=1,
                peers=len(a_others) + len(b_others),
                explained_by=slower.nodes[0] if explained else None,
            )
        )
    return sorted(suspects, key=lambda s: (-s.gap_pct, s.kind, s.nodes))


def describe(suspect: Suspect, unit: str) -> str:
    """One line naming the suspect with its figures, e.g. 'node n4: its 3 pairs median 12.1 GB/s (fastest
    12.4) vs 48.0 GB/s for the 3 pairs without it'."""
    if suspect.kind == "node":
        without = "the pair" if suspect.peers == 1 else f"the {suspect.peers} pairs"
        return (
            f"node {suspect.nodes[0]}: its {suspect.pairs} pairs median {suspect.median:.4g} {unit} "
            f"(fastest {suspect.value:.4g}) vs {suspect.reference:.4g} {unit} for {without} without it"
        )
    a, b = suspect.nodes
    line = (
        f"link {a}+{b}: {suspect.value:.4g} {unit} vs {suspect.median:.4g} {unit} for {a}'s other pairs "
        f"and {suspect.other_median:.4g} {unit} for {b}'s"
    )
    if suspect.explained_by:
        line += f", within the scatter of node {suspect.explained_by}'s slow pairs"
    return line
