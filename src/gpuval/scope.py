"""Where a measurement or check applies: its scope, built and read here and nowhere else.

A scope is stored as text in result.json, JUnit, HTML and the history database, in these shapes:

    cluster             the whole run
    node:NAME           one node
    gpu:NODE/INDEX      one GPU, by the node's own numbering (what nvidia-smi shows)
    cpu:NODE/RANK       a rank that ran on the CPU (no GPU)
    link:NODE/A-B       a link inside a node: gpu0-gpu1 (P2P), gpu0-nvlink5, mlx5_0-port1
    pair:A+B            a measurement made across nodes A and B

`Scope` is that text as a value: build one with its constructors, `str()` gives the stored text, `parse`
reads it back strictly (a malformed scope is a one-line UsageError). Readers of files that may hold
other text (a result.json written by hand) use the lenient `node_of` and `place_of`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

from gpuval.errors import UsageError

Kind = Literal["cluster", "node", "gpu", "cpu", "link", "pair"]
CLUSTER = "cluster"
SHAPES = "cluster, node:NAME, gpu:NODE/INDEX, cpu:NODE/RANK, link:NODE/A-B or pair:A+B"

# A node name holds none of the separators (':' '/' '+') nor blanks; a link's second end holds no '-'.
_NAME = r"[^\s:/+]+"
_PATTERNS: dict[str, re.Pattern[str]] = {
    "node": re.compile(rf"node:(?P<node>{_NAME})"),
    "gpu": re.compile(rf"gpu:(?P<node>{_NAME})/(?P<index>\d+)"),
    "cpu": re.compile(rf"cpu:(?P<node>{_NAME})/(?P<index>\d+)"),
    "link": re.compile(rf"link:(?P<node>{_NAME})/(?P<a>[^\s/]+)-(?P<b>[^\s/-]+)"),
    "pair": re.compile(rf"pair:(?P<node>{_NAME})\+(?P<other>{_NAME})"),
}


class ScopeError(UsageError):
    """A scope text of none of the known shapes."""


def node_name_problem(name: str) -> str | None:
    """Why `name` cannot name a node in a scope (None: it can): the input gate for node names that come
    from outside (GPUVAL_NODE_NAME, SLURMD_NODENAME, the host name)."""
    if not re.fullmatch(_NAME, name):
        return "a node name holds no blank, ':', '/' or '+' (it is written into every result's scopes)"
    return None


@dataclass(frozen=True)
class Scope:
    """One scope. `node` is the node it lies on (a pair's first node); `index` a GPU's index or a CPU
    rank; `ends` a link's two ends; `other` a pair's second node."""

    kind: Kind
    node: str | None = None
    index: int | None = None
    ends: tuple[str, str] | None = None
    other: str | None = None

    def __post_init__(self) -> None:
        text = self.render()
        second_end = self.ends[1] if self.ends else ""
        if self.kind != "cluster" and (not _PATTERNS[self.kind].fullmatch(text) or "-" in second_end):
            raise ScopeError(
                f"scope {text!r} would not read back as built: a node name holds no blank, ':', '/' or '+', "
                "an index is a whole number from 0, a link's second end holds no '-'"
            )

    @classmethod
    def cluster(cls) -> Scope:
        return cls("cluster")

    @classmethod
    def of_node(cls, node: str) -> Scope:
        return cls("node", node=str(node))

    @classmethod
    def gpu(cls, node: str, index: int) -> Scope:
        return cls("gpu", node=str(node), index=int(index))

    @classmethod
    def cpu(cls, node: str, rank: int) -> Scope:
        return cls("cpu", node=str(node), index=int(rank))

    @classmethod
    def link(cls, node: str, a: str, b: str) -> Scope:
        """A link inside `node` from end `a` to end `b`: link(n, 'gpu0', 'nvlink5') is link:n/gpu0-nvlink5."""
        return cls("link", node=str(node), ends=(str(a), str(b)))

    @classmethod
    def pair(cls, a: str, b: str) -> Scope:
        """A measurement made across nodes `a` and `b`."""
        return cls("pair", node=str(a), other=str(b))

    @classmethod
    def parse(cls, text: str) -> Scope:
        """The scope `text` names; anything else is a ScopeError naming the text and the shapes known."""
        if text == CLUSTER:
            return cls.cluster()
        kind = text.partition(":")[0] if isinstance(text, str) else ""
        pattern = _PATTERNS.get(kind)
        match = pattern.fullmatch(text) if pattern else None
        if match is None:
            raise ScopeError(f"scope {str(text)[:80]!r} is not one of {SHAPES}")
        found = match.groupdict()
        index = int(found["index"]) if found.get("index") is not None else None
        ends = (found["a"], found["b"]) if found.get("a") is not None else None
        return cls(kind, node=found["node"], index=index, ends=ends, other=found.get("other"))  # type: ignore[arg-type]

    def render(self) -> str:
        """The stored text: what result.json, JUnit, HTML and the history database hold."""
        if self.kind == "cluster":
            return CLUSTER
        return f"{self.kind}:{self.place}"

    def __str__(self) -> str:
        return self.render()

    @property
    def place(self) -> str:
        """The text after the kind: 'n1/3' for gpu:n1/3, 'n1' for node:n1, 'cluster' for the cluster."""
        if self.kind == "cluster":
            return CLUSTER
        if self.kind == "node":
            return f"{self.node}"
        if self.kind in ("gpu", "cpu"):
            return f"{self.node}/{self.index}"
        if self.kind == "link":
            a, b = self.ends or ("", "")
            return f"{self.node}/{a}-{b}"
        return f"{self.node}+{self.other}"

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the scope touches: none for the cluster, both for a pair."""
        if self.kind == "cluster":
            return ()
        return (self.node or "", self.other or "") if self.kind == "pair" else (self.node or "",)

    @property
    def gpu_index(self) -> int | None:
        """The GPU's index for a gpu scope, else None."""
        return self.index if self.kind == "gpu" else None

    @property
    def owner(self) -> str | None:
        """The node a check is filed under (accept's health excuse, the history database): its node, a
        pair's 'A+B' (neither node alone), None for the cluster."""
        return "+".join(self.nodes) if self.nodes else None


def read(text: str) -> Scope | None:
    """The scope `text` names, or None where it is of no known shape (a lenient reader of files)."""
    return _read(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=2**17)  # a 1,000-node result names ~65,000 scopes, most of them many times
def _read(text: str) -> Scope | None:
    """read(), once per text: a Scope is immutable, so readers share one."""
    try:
        return Scope.parse(text)
    except ScopeError:
        return None


def node_of(text: str) -> str | None:
    """The node a scope text belongs to: 'gpu:node1/3' -> 'node1'; 'node:node1' -> 'node1'; a pair's
    'A+B'; None for 'cluster' and for text of no known shape."""
    scope = read(text)
    return scope.owner if scope is not None else None


def place_of(text: str) -> str:
    """A scope text without its kind, for a label: 'gpu:node1/3' -> 'node1/3'; text of no known shape as
    it is."""
    scope = read(text)
    return scope.place if scope is not None else text


def is_pair(text: str) -> bool:
    """Whether a scope text names a measurement made across two nodes."""
    scope = read(text)
    return scope is not None and scope.kind == "pair"
