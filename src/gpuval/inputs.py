"""The one gate every input file passes: profiles, fine-tune configs, datasets, result files.

A file is read only when it is a regular file (a FIFO, a device or a directory is refused without
blocking on it), no larger than a bound, and strict UTF-8; YAML refuses duplicate keys, deep nesting and
integers too large for any field; JSON refuses NaN/Infinity (gpuval writes null for them) and the same.
Every problem is one UsageError line: the file, the place in it, and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic_core
import yaml

from gpuval.errors import UsageError

MAX_BYTES = 64 * 2**20  # profiles, configs and result files are kilobytes; datasets megabytes
MAX_DATASET_BYTES = 4 * 2**30
MAX_DEPTH = 64  # nesting of mappings and lists; gpuval's own files are at most ~8 deep
MAX_INT = 2**63 - 1  # no field holds more; a larger integer is a typo


def read_input_text(path: str | os.PathLike[str], kind: str, max_bytes: int = MAX_BYTES) -> str:
    """The text of `path`, a regular file of at most `max_bytes` of strict UTF-8."""
    where = f"{kind} '{path}'"
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror or exc}); check the path") from None
    _require_regular(info, where)
    if info.st_size > max_bytes:
        raise UsageError(
            f"{where}: {info.st_size} bytes is more than the {max_bytes} allowed; is it the right file?"
        )
    try:
        # O_NONBLOCK: should the path have become a FIFO since the stat, opening it does not wait
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror or exc}); check its permissions") from None
    try:
        _require_regular(os.fstat(fd), where)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UsageError(f"{where}: more than the {max_bytes} bytes allowed; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{where}: not UTF-8 text (byte {exc.start}: 0x{data[exc.start]:02x}); save it as UTF-8"
        ) from None


def _require_regular(info: os.stat_result, where: str) -> None:
    if stat.S_ISREG(info.st_mode):
        return
    what = (
        "a directory"
        if stat.S_ISDIR(info.st_mode)
        else "a FIFO"
        if stat.S_ISFIFO(info.st_mode)
        else "a device"
        if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
        else "a socket"
        if stat.S_ISSOCK(info.st_mode)
        else "not a regular file"
    )
    raise UsageError(f"{where}: cannot read it (it is {what}, not a file); give the path of a file")


# --- YAML ------------------------------------------------------------------------------------------------


class _LimitError(yaml.constructor.ConstructorError):
    """Valid YAML that gpuval refuses: a duplicate key, too deep, an integer too large."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, nesting deeper than MAX_DEPTH and integers past MAX_INT."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _LimitError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # noqa: ANN001
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader itself says so below
                    continue
                if duplicate:
                    raise _LimitError(
                        None, None, f"duplicate key '{key}': keep only one", key_node.start_mark
                    )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):  # noqa: ANN001
        digits = self.construct_scalar(node).replace("_", "").lstrip("+-")
        if len(digits) > 40:  # int() of thousands of digits is slow, and refused past 4300
            raise _LimitError(None, None, f"integer of {len(digits)} digits is too large", node.start_mark)
        value = super().construct_yaml_int(node)
        if abs(value) > MAX_INT:
            raise _LimitError(
                None, None, f"integer {value} is too large (at most {MAX_INT})", node.start_mark
            )
        return value


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)


def parse_yaml(text: str, where: str, lenient: bool = False) -> Any:
    """YAML text through the strict loader; a problem is a UsageError naming `where` and the line.

    `lenient` (a --set value): text that is no YAML is returned as it is, a refused value is still refused.
    """
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        if lenient and not isinstance(exc, _LimitError):
            return text
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{where}: broken YAML{at}: {problem}; fix it there") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply; flatten it") from None
    if _expands_past(data, MAX_VALUES):
        raise UsageError(
            f"{where}: expands to more than {MAX_VALUES:,} values (aliases of aliases?); write it out plainly"
        )
    return data


MAX_VALUES = 100_000  # values a YAML document may expand to once its aliases (*name) are followed


def _expands_past(data: Any, limit: int) -> bool:
    """Whether `data`, with every shared (aliased) part counted each time it is reached, holds more than
    `limit` values: a few lines of nested aliases ("billion laughs") expand exponentially in whatever
    walks them later (validation, the result's settings)."""
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def load_yaml_mapping(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """A YAML file holding a mapping at the top."""
    where = f"{kind} '{path}'"
    data = parse_yaml(read_input_text(path, kind), where)
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of keys at the top, got {type(data).__name__}")
    return data


# --- JSON ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector held off for the block (as it was before, after it). Building
    the millions of objects of a large document triggers collections that each walk every object made so
    far: reading and validating a 1,000-node result took 5.2 s with them and 2.9 s without
    (benchmarks/report_scale.py). What JSON and pydantic build holds no reference cycle, so nothing is
    left for the collector to find; reference counting frees the rest as always.

    `freeze`, for a short command that has just read a large document: every object made so far is then
    moved out of the collector's sight for the rest of the process (gc.freeze), so that neither the
    collections of what the command does next nor the one at exit walk them again (~1.5 s for one such
    result). Never in a long-lived process: cyclic garbage made before the freeze would never be freed."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def decode_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no overflowing numbers, no lone surrogate, bounded nesting; any
    problem is a ValueError (json.JSONDecodeError for the syntax, at its line and column).

    Parsed by pydantic-core's JSON parser (jiter), which refuses NaN, Infinity and lone UTF-16
    surrogates itself and reads a 1,000-node result in 1.1 s where json.loads took 1.6
    (benchmarks/report_scale.py); the walk below bounds the nesting and the numbers."""
    try:
        with collector_paused():
            value = pydantic_core.from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        raise _syntax_error(str(exc), text) from None
    problem = _structure_problem(value)
    if problem:
        raise ValueError(problem)
    return value


_PARSER_PLACE = re.compile(r"(?P<msg>.*) at line (?P<line>\d+) column (?P<column>\d+)", re.S)


def _syntax_error(said: str, text: str) -> ValueError:
    """What the parser said, as the error json.loads would raise: a JSONDecodeError at the line and column
    it names (a lone surrogate or nesting past the parser's own limit in gpuval's words)."""
    found = _PARSER_PLACE.fullmatch(said)
    if found is None:  # no place given: say it as it is
        return ValueError(f"not JSON ({said})")
    msg, line, column = found["msg"], int(found["line"]), int(found["column"])
    if msg == "recursion limit exceeded":
        return ValueError(f"nested more than {MAX_DEPTH} levels deep")
    if "surrogate" in msg or "hex escape" in msg:  # not a syntax error: bad text, as NaN is a bad number
        return ValueError(f"a string holds a lone UTF-16 surrogate ({msg} at line {line} column {column})")
    start = 0
    for _ in range(line - 1):  # the offset of the line named: json.JSONDecodeError counts from there
        start = text.find("\n", start) + 1
    at = min(len(text), start + max(column - 1, 0))
    if _CONSTANT.match(text, max(at - 1, 0)) or _CONSTANT.match(text, at):
        return ValueError(f"NaN and Infinity are not JSON (gpuval writes null for them; line {line})")
    if text.startswith("\ufeff"):
        msg = "a byte-order mark starts the text; save it as UTF-8 without one"
    return json.JSONDecodeError(msg, text, at)


_CONSTANT = re.compile(r"-?(?:NaN|Infinity)")


_INFINITY = float("inf")


def _number_problem(value: Any) -> str | None:
    """Why a number the parser made is refused: an integer past MAX_INT either way, or a float past the
    largest double (1e309 reads as infinity), or None."""
    kind = type(value)
    if kind is int and (value > MAX_INT or value < -MAX_INT):
        # str() of an integer of thousands of digits is slow, and refused past sys.get_int_max_str_digits()
        digits = round(value.bit_length() * 0.30103)  # log10(2): about this many digits
        shown = str(value) if digits <= 40 else f"of about {digits} digits"
        return f"integer {shown} is too large (at most {MAX_INT})"
    if kind is float and (value == _INFINITY or value == -_INFINITY):
        return "a number too large for a float (1.8e308 at most)"
    return None


def _structure_problem(value: Any) -> str | None:
    """json_problem's depth rule, and the numbers' bounds, level by level: a value nested more than
    MAX_DEPTH levels (the top being level 0) is refused, and so is a number _number_problem refuses. For
    what the parser made: dicts, lists, int and float tested by exact type (bool is not int here; a
    1,000-node result: ~0.4 s, against 0.9 s with isinstance and a generator)."""
    if type(value) is not dict and type(value) is not list:
        return _number_problem(value)
    level, depth = [value], 0
    while level:
        following: list[Any] = []
        keep = following.append
        for item in level:
            children = item.values() if type(item) is dict else item
            if depth >= MAX_DEPTH and children:
                return f"nested more than {MAX_DEPTH} levels deep"
            for child in children:
                kind = type(child)
                if kind is dict or kind is list:
                    keep(child)
                elif kind is int:
                    if child > MAX_INT or child < -MAX_INT:
                        return _number_problem(child)
                elif kind is float and (child == _INFINITY or child == -_INFINITY):
                    return _number_problem(child)
        level, depth = following, depth + 1
    return None


def parse_json(text: str, where: str) -> Any:
    """decode_json, a problem being a UsageError naming `where`."""
    try:
        return decode_json(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix it there"
        ) from None
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}; fix the file") from None


def json_problem(value: Any, depth: int = 0) -> str | None:
    """Why a decoded JSON value cannot be used (too deep, a lone UTF-16 surrogate), or None."""
    if depth > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, float) and not math.isfinite(value):
        return "a number that is NaN or too large"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"a string holds a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x}), not text"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            problem = json_problem(key, depth + 1) or json_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, list):
        for item in value:
            problem = json_problem(item, depth + 1)
            if problem:
                return problem
    return None


def load_json(path: str | os.PathLike[str], kind: str, max_bytes: int = MAX_BYTES) -> Any:
    """A JSON file through the gate."""
    return parse_json(read_input_text(path, kind, max_bytes), f"{kind} '{path}'")


def refused_input(exc: BaseException) -> UsageError | None:
    """The usage error that an exception escaping a command stands for, where it can only come from what
    the user gave: a path longer than the OS allows (ENAMETOOLONG, from any check or open of it) or
    nesting past Python's recursion limit (RecursionError, from a parser). None for anything else.

    Every input has its own gate that says this naming the option or the line; this is the net under
    them, so that neither ever reaches the user as a traceback (cli.main)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        name = exc.filename if exc.filename is not None else "a path"
        shown = f"'{name}'" if isinstance(name, str) else repr(name)
        return UsageError(f"{shown}: the name is longer than the file system allows; give a shorter path")
    if isinstance(exc, RecursionError):
        return UsageError(
            "an input is nested deeper than Python's parser can follow (RecursionError); flatten it"
        )
    return None


def is_regular_file(path: Path) -> bool:
    """True for an existing regular file (never opens it)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False
