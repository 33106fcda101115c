"""Slurm's hostlist expressions: `node[001-003,007],gpu-a7` read into names and names written back as one.

The syntax is the one `scontrol show hostnames` reads and `scontrol show hostlist` writes (Slurm's
hostlist.c, documented under "HOSTLIST EXPRESSIONS" in Slurm's man pages): expressions separated by
commas; in an expression, a bracket holds numbers and ranges `lo-hi` separated by commas, and the width of
`lo` is the width every number of the range is written in (`[08-10]` is 08 09 10, `[8-10]` is 8 9 10);
several brackets in one expression give every combination (`rack[1-2]-n[1-2]`). `SLURM_JOB_NODELIST` holds
such an expression.

Writing names back, a name's trailing digits are its number and the rest its prefix; names of one prefix
share one bracket, numbers written with a leading zero keep their width, and a name without trailing
digits is written as it is.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable

from gpuval.errors import UsageError

MAX_NAMES = 100_000  # more than any cluster has: a range past it is a typo (node[1-1000000])
_TRAILING_NUMBER = re.compile(r"(?P<prefix>.*?)(?P<number>\d+)")
_RANGE = re.compile(r"(?P<low>\d+)(?:-(?P<high>\d+))?")
_NOT_IN_A_NAME = re.compile(r"[\s\[\],:/+]")  # hostlist separators, and what a scope's node name refuses


class HostlistError(UsageError):
    """A hostlist expression that does not parse: one line naming the expression and the fault."""


def name_problem(name: str) -> str | None:
    """Why `name` cannot be written into a hostlist, None when it can."""
    if not name:
        return "an empty node name"
    if _NOT_IN_A_NAME.search(name):
        return f"node name {name!r} holds a blank, ',', '[', ']', ':', '/' or '+'"
    return None


def parse(expression: str) -> list[str]:
    """Every name of a hostlist expression, in its order, each once."""
    text = expression.strip()
    if not text:
        raise HostlistError("empty hostlist: write names such as node[001-200] or node1,node2")
    names: list[str] = []
    for term in _terms(text, expression):
        names.extend(_expand(term, expression))
        if len(names) > MAX_NAMES:
            raise HostlistError(f"hostlist {expression[:80]!r} names more than {MAX_NAMES} nodes")
    return list(dict.fromkeys(names))


def _terms(text: str, expression: str) -> list[str]:
    """The comma-separated expressions of `text`, commas inside brackets kept."""
    terms, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"hostlist {expression[:80]!r}: a '[' inside a bracket")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"hostlist {expression[:80]!r}: a ']' with no '[' before it")
        elif char == "," and depth == 0:
            terms.append(text[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"hostlist {expression[:80]!r}: a '[' that is never closed")
    terms.append(text[start:])
    for term in terms:
        if not term.strip():
            raise HostlistError(f"hostlist {expression[:80]!r}: an empty name between commas")
    return [term.strip() for term in terms]


def _expand(term: str, expression: str) -> list[str]:
    """The names of one expression: the product of its brackets' numbers, between its fixed pieces."""
    pieces = re.split(r"\[([^\]]*)\]", term)  # fixed, bracket, fixed, bracket, ..., fixed
    choices: list[list[str]] = []
    for index, piece in enumerate(pieces):
        choices.append(_numbers(piece, expression) if index % 2 else [piece])
    if math.prod(len(choice) for choice in choices) > MAX_NAMES:
        raise HostlistError(f"hostlist {expression[:80]!r} names more than {MAX_NAMES} nodes")
    names = ["".join(parts) for parts in itertools.product(*choices)]
    for name in names[:1] + names[-1:]:  # every name shares the fixed pieces; the ends show their shape
        if (problem := name_problem(name)) is not None:
            raise HostlistError(f"hostlist {expression[:80]!r}: {problem}")
    return names


def _numbers(bracket: str, expression: str) -> list[str]:
    """The numbers a bracket holds, each written in its range's width."""
    found: list[str] = []
    for item in bracket.split(","):
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            raise HostlistError(
                f"hostlist {expression[:80]!r}: {item.strip()!r} in brackets is not a number or a range lo-hi"
            )
        low_text, high_text = match["low"], match["high"] or match["low"]
        low, high = int(low_text), int(high_text)
        if high < low:
            raise HostlistError(f"hostlist {expression[:80]!r}: the range {item.strip()} runs backwards")
        if high - low + len(found) >= MAX_NAMES:
            raise HostlistError(f"hostlist {expression[:80]!r} names more than {MAX_NAMES} nodes")
        width = len(low_text)
        found.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return found


def compress(names: Iterable[str]) -> str:
    """The shortest hostlist of the kind Slurm writes for `names` (order and repeats do not matter): one
    bracket per prefix, consecutive numbers as ranges; '' for no names."""
    by_prefix: dict[str, list[str]] = defaultdict(list)
    plain: set[str] = set()
    for name in set(names):
        if (problem := name_problem(name)) is not None:
            raise ValueError(problem)
        match = _TRAILING_NUMBER.fullmatch(name)
        if match is None:
            plain.add(name)
        else:
            by_prefix[match["prefix"]].append(match["number"])
    terms = [(name, name) for name in plain]
    for prefix, numbers in by_prefix.items():
        ranges = _ranges(numbers)
        inside = ",".join(ranges)
        whole = f"{prefix}{inside}" if len(numbers) == 1 else f"{prefix}[{inside}]"
        terms.append((prefix, whole))
    return ",".join(whole for _, whole in sorted(terms))


def _ranges(numbers: list[str]) -> list[str]:
    """Numbers as a bracket's items: runs of consecutive numbers of one width as lo-hi, in number order.

    A number written with a leading zero has its width fixed (007); one without is written as it is, and
    joins a run of fixed width when it has that many digits (099 and 100 run as 099-100), else runs with
    other unpadded numbers (9 and 10 run as 9-10: a range's width is its low end's)."""
    padded = {len(text) for text in numbers if len(text) > 1 and text.startswith("0")}
    by_width: dict[int, list[int]] = defaultdict(list)
    for text in numbers:
        width = len(text) if len(text) in padded else 0  # 0: written as it is
        by_width[width].append(int(text))
    runs: list[tuple[int, int, int]] = []  # (low, high, width)
    for width, values in by_width.items():
        values.sort()
        low = previous = values[0]
        for value in values[1:]:
            if value != previous + 1:
                runs.append((low, previous, width))
                low = value
            previous = value
        runs.append((low, previous, width))
    return [
        f"{low:0{width}d}" if low == high else f"{low:0{width}d}-{high:0{width}d}"
        for low, high, width in sorted(runs, key=lambda run: (run[0], run[2]))
    ]
