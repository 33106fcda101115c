"""JSON Lines (https://jsonlines.org), read and written the one way for every .jsonl file gpuval touches:
Glaive input, prepared splits, synth output, eval predictions, a soak's iterations.

A line ends at "\\n" alone ("\\r\\n" too). `str.splitlines()` would also break at U+2028, U+2029, U+0085,
\\x0b, \\x0c and \\x1c-\\x1e, which may stand inside a JSON string and do turn up in scraped text: splitting
there cuts a valid record in two. JSON escapes the control characters among them, but
`json.dumps(..., ensure_ascii=False)` and pydantic leave U+0085, U+2028 and U+2029 raw; a line written here
has those escaped too, so it reads back as one line whoever splits it, while other non-ASCII text stays
as readable as ensure_ascii=False leaves it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

# The line breaks of str.splitlines() that a JSON encoder writes raw: every other one is a control
# character, which JSON must escape (tests/test_jsonl.py checks this against every code point).
_RAW_BREAKS = {ord(char): f"\\u{ord(char):04x}" for char in "\x85\u2028\u2029"}


def escape_breaks(json_text: str) -> str:
    """`json_text` (json.dumps or pydantic output, without indent) with the line breaks it left raw
    written as \\u escapes. Outside strings JSON text holds none, so only string contents change, and
    they decode to the same characters."""
    return json_text.translate(_RAW_BREAKS)


def dump_line(value: Any) -> str:
    """`value` as one JSON Lines line, without its "\\n"."""
    return escape_breaks(json.dumps(value, ensure_ascii=False))


def dump_lines(values: Iterable[Any]) -> str:
    """The text of a JSON Lines file holding `values`, a line each, every line ending in "\\n"."""
    return "".join(dump_line(value) + "\n" for value in values)


def split_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of every line of `text` that is not blank (whitespace only), split on
    "\\n" alone and without a "\\r" that ended it."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line.removesuffix("\r")
