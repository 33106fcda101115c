"""`gpuval finetune prepare`: Glaive or OpenAI tool-format records → DIR/train.jsonl, eval.jsonl,
eval_unseen.jsonl, stats.json.

Each output line is `{"tools": [...], "messages": [...]}` (see glaive.py; openai_format.py gives the same
shape). The format is one per file: `--format`, or by default what the first records look like. A record
that cannot be converted is skipped and counted by reason in stats.json; an unreadable input or output, a
file in neither format, and one that leaves no conversation with a tool call are errors.

Splits, all deterministic for a seed:
- **Held-out functions**: the names called somewhere, sorted, shuffled with the seed, taken in that order
  whenever the records that name them (in tools or in a call) stay within `unseen_fraction` of the kept
  records; when none fits (small inputs), the one function named by the fewest records. Never every called
  function, and none at fraction 0. train.jsonl and eval.jsonl never show a held-out function at all.
- **eval_unseen** holds the records that name a held-out function and call no other function (refusals
  with held-out tools included). A record that names a held-out function but calls a seen one belongs to
  no split: it is counted as `excluded_mixed` in stats.json.
- **eval** is a random `eval_fraction` of the remaining records (in-distribution); **train** the rest.
  Both keep the input order: at fractions 0 train.jsonl is every kept record in input order.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from gpuval import jsonl
from gpuval.errors import UsageError
from gpuval.finetune.data import glaive, openai_format
from gpuval.finetune.data.glaive import NOT_JSON, MalformedRecord
from gpuval.inputs import MAX_DATASET_BYTES, decode_json, json_problem, read_input_text

STATS_SCHEMA = "gpuval.finetune.prepare/v1"
SPLITS = ("train", "eval", "eval_unseen")
EXAMPLES_PER_REASON = 3  # stats.json names where the first few skipped records are, to find them
FORMATS = {"glaive": "Glaive format", "openai": "OpenAI tool format"}  # --format value -> its name
FORMAT_KEYS = {"glaive": '{"system", "chat"}', "openai": '{"messages", "tools"}'}  # what a record holds
CONVERTERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "glaive": glaive.convert_record,
    "openai": openai_format.convert_record,
}
DETECT_RECORDS = 20  # the first records that are JSON decide a file's format under --format auto


@dataclass(frozen=True)
class SourceRecord:
    where: str  # "line 12" or "record 12" (1-based), for people looking for it
    record: Any  # the decoded record, or _UNDECODABLE


_UNDECODABLE = object()


def prepare(
    source: str,
    output: Path,
    eval_fraction: float = 0.02,
    seed: int = 0,
    unseen_fraction: float | None = None,
    input_format: str = "auto",
) -> dict[str, Any]:
    """Convert, split and write; returns the stats written to DIR/stats.json. `input_format` is "auto"
    (detect_format), "glaive" or "openai"."""
    from gpuval.atomic import ensure_writable_dir, missing_folders, remove_empty_folders

    unseen_fraction = eval_fraction if unseen_fraction is None else unseen_fraction
    for flag, value in (("--eval-fraction", eval_fraction), ("--unseen-fraction", unseen_fraction)):
        if not 0 <= value < 1:
            raise UsageError(f"{flag} {value} is outside [0, 1)")
    records = read_source(source)  # before creating the output directory: a bad input leaves nothing
    fmt = choose_format(source, records, input_format)
    created = missing_folders(output)
    ensure_writable_dir(output)
    try:
        return _convert_and_write(source, output, records, fmt, seed, eval_fraction, unseen_fraction)
    except BaseException:
        remove_empty_folders(created)  # nothing written (every file or none): leave no trace of this run
        raise


def _convert_and_write(
    source: str,
    output: Path,
    records: list[SourceRecord],
    fmt: str,
    seed: int,
    eval_fraction: float,
    unseen_fraction: float,
) -> dict[str, Any]:
    from gpuval.atomic import write_texts_atomic

    kept, skipped = convert_all(records, fmt)
    if not any(functions_called(conversation) for conversation in kept):
        raise UsageError(_nothing_usable(source, records, fmt, kept, skipped))
    unseen_functions = choose_unseen_functions(kept, unseen_fraction, seed)
    splits = split_records(kept, unseen_functions, eval_fraction, seed)
    stats = {
        "schema": STATS_SCHEMA,
        "input": source,
        "format": fmt,
        "seed": seed,
        "eval_fraction": eval_fraction,
        "unseen_fraction": unseen_fraction,
        "total": len(records),
        "kept": len(kept),
        "skipped": sum(len(v) for v in skipped.values()),
        "skipped_by_reason": {reason: len(where) for reason, where in sorted(skipped.items())},
        "skipped_examples": {r: w[:EXAMPLES_PER_REASON] for r, w in sorted(skipped.items())},
        "splits": {name: len(splits[name]) for name in SPLITS},
        "excluded_mixed": len(kept) - sum(len(splits[name]) for name in SPLITS),
        "unseen_functions": sorted(unseen_functions),
    }
    texts = {output / f"{name}.jsonl": jsonl.dump_lines(splits[name]) for name in SPLITS}
    texts[output / "stats.json"] = json.dumps(stats, indent=2, ensure_ascii=False) + "\n"
    try:
        write_texts_atomic(texts)  # every file or none: a failed write leaves DIR as it was
    except OSError as exc:
        where = exc.filename if exc.filename is not None else output
        raise UsageError(
            f"prepared data: cannot write '{where}' ({exc.strerror or exc}); free some space or choose "
            "another output folder"
        ) from None
    return stats


def read_jsonl(path: str | Path, what: str) -> list[tuple[int, Any]]:
    """(line number, decoded value) of every non-blank line of a prepared JSONL file; an unreadable file
    or a line that is not JSON is one UsageError naming `what`, the file and the line."""
    values = []
    for number, line in jsonl.split_lines(read_input_text(path, what, MAX_DATASET_BYTES)):
        try:
            values.append((number, decode_json(line)))
        except ValueError as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise UsageError(
                f"{what} '{path}' line {number}: not JSON ({why}); write it with `finetune prepare`"
            ) from None
    return values


def read_source(source: str) -> list[SourceRecord]:
    """The records of a JSON list or JSONL file, or of a `datasets` name when no such file exists."""
    path = Path(source).expanduser()
    if path.is_dir():
        raise UsageError(
            f"--input '{source}' is a directory; give a .json or .jsonl file of Glaive or OpenAI "
            "tool-format records"
        )
    if not path.exists():
        if path.suffix in (".json", ".jsonl") or source.startswith(("/", ".", "~")):
            raise UsageError(f"--input '{source}': no such file")
        return _read_dataset(source)
    text = read_input_text(path, "--input", MAX_DATASET_BYTES)  # a regular file of UTF-8 text, or exit 2
    records = _parse_text(source, text)
    if not records:
        raise UsageError(f"--input '{source}' holds no records")
    return records


def _parse_text(source: str, text: str) -> list[SourceRecord]:
    if text.lstrip().startswith("["):  # a JSON list, as Glaive ships it
        try:
            items = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--input '{source}' is a JSON list that does not parse "
                f"(line {exc.lineno}, column {exc.colno}: {exc.msg}); fix it or convert it to JSONL"
            ) from None
        except (ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise UsageError(f"--input '{source}': {why}; fix it or convert it to JSONL") from None
        if not isinstance(items, list):  # '[1] x' cannot get here; a list is what Glaive ships
            raise UsageError(f"--input '{source}': expected a JSON list of records")
        # a record holding what no JSON text can carry (a lone surrogate) is skipped like broken JSON
        return [
            SourceRecord(f"record {i}", _UNDECODABLE if json_problem(item) else item)
            for i, item in enumerate(items, start=1)
        ]
    records = []
    for number, line in jsonl.split_lines(text):
        try:
            records.append(SourceRecord(f"line {number}", decode_json(line)))
        except ValueError:  # not JSON, NaN, a lone surrogate, too deep: skipped and counted as not_json
            records.append(SourceRecord(f"line {number}", _UNDECODABLE))
    return records


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _read_dataset(name: str) -> list[SourceRecord]:
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"--input '{name}' is not a file; loading a dataset by name needs the 'datasets' package "
            "(pip install datasets), or pass a .json/.jsonl file"
        ) from None
    try:
        dataset = datasets.load_dataset(name, split="train")
    except Exception as exc:  # noqa: BLE001 - datasets raises many types (network, hub, format): one line
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"--input '{name}': cannot load the dataset ({type(exc).__name__}: {first_line})"
        ) from None
    return [SourceRecord(f"record {i}", dict(row)) for i, row in enumerate(dataset, start=1)]


def convert_all(
    records: list[SourceRecord], fmt: str = "glaive"
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The conversation of every record of format `fmt` (a FORMATS key) that converts, and where the
    others are, by reason."""
    convert_record = CONVERTERS[fmt]
    kept: list[dict[str, Any]] = []
    skipped: dict[str, list[str]] = {}
    for item in records:
        try:
            if item.record is _UNDECODABLE:
                raise MalformedRecord(NOT_JSON)
            conversation = convert_record(item.record)
            problem = json_problem(conversation)  # e.g. a lone surrogate inside a call's arguments
            if problem:
                raise MalformedRecord(NOT_JSON, problem)
            kept.append(conversation)
        except RecursionError:  # JSON nested inside a field (a call's arguments, a tool schema): too deep
            skipped.setdefault(NOT_JSON, []).append(f"{item.where}: nested too deeply for the parser")
        except MalformedRecord as exc:
            detail = f"{item.where}: {exc.detail}" if exc.detail else item.where
            skipped.setdefault(exc.reason, []).append(detail)
    return kept, skipped


def record_format(record: Any) -> str | None:
    """The format a decoded record looks like by its keys, whether or not it converts."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "openai"
    if "chat" in record or "system" in record:
        return "glaive"
    return None


def detect_format(records: list[SourceRecord]) -> str | None:
    """The format most of the first DETECT_RECORDS records that are JSON look like (on a tie, the first
    seen), or None when none looks like either."""
    sample = islice((item.record for item in records if item.record is not _UNDECODABLE), DETECT_RECORDS)
    votes = Counter(fmt for fmt in map(record_format, sample) if fmt)
    return max(votes, key=votes.__getitem__) if votes else None  # max keeps the first of equals


def choose_format(source: str, records: list[SourceRecord], requested: str) -> str:
    """The format to read `records` in: `requested`, or under "auto" the detected one."""
    if requested in FORMATS:
        return requested
    if requested != "auto":
        raise UsageError(f"--format {requested!r}: expected auto, {', '.join(FORMATS)}")
    detected = detect_format(records)
    if detected is None:
        raise UsageError(
            f"--input '{source}': {_records(len(records))} in neither {FORMATS['glaive']} "
            f"({FORMAT_KEYS['glaive']}) nor {FORMATS['openai']} ({FORMAT_KEYS['openai']}): "
            f"{describe_first(records)}"
        )
    return detected


def describe_first(records: list[SourceRecord]) -> str:
    """What the first record that is JSON holds, for an error naming what was found."""
    first = next((item.record for item in records if item.record is not _UNDECODABLE), _UNDECODABLE)
    if first is _UNDECODABLE:
        return "no record is JSON"
    if isinstance(first, dict) and first:
        keys = ", ".join(repr(key) for key in list(first)[:6]) + (", ..." if len(first) > 6 else "")
        return f"the first is an object with keys {keys}"
    return f"the first is {'an empty object' if first == {} else openai_format.json_kind(first)}"


def _nothing_usable(
    source: str,
    records: list[SourceRecord],
    fmt: str,
    kept: list[dict[str, Any]],
    skipped: dict[str, list[str]],
) -> str:
    """One line for a file that gave no conversation with a tool call: the format read, and why."""
    message = (
        f"--input '{source}': no usable conversation with a tool call in {_records(len(records))} "
        f"read as {FORMATS[fmt]}"
    )
    detected = detect_format(records)
    if detected is None:
        return message + f"; the records look like neither format: {describe_first(records)}"
    if detected != fmt:
        return message + f"; the records look like {FORMATS[detected]}: pass --format {detected}"
    if kept:
        return message + f"; {len(kept)} kept, none calls a function"
    reasons = ", ".join(f"{reason} {len(where)}" for reason, where in sorted(skipped.items()))
    example = max(skipped.values(), key=len)[0]
    return message + f"; every record was skipped ({reasons}), e.g. {example}"


def _records(count: int) -> str:
    return "1 record" if count == 1 else f"{count} records"


def functions_named(conversation: dict[str, Any]) -> set[str]:
    """Every function a conversation shows: in its tools or in a call."""
    names = {tool["name"] for tool in conversation["tools"]}
    for message in conversation["messages"]:
        names.update(call["name"] for call in message.get("tool_calls", ()))
    return names


def functions_called(conversation: dict[str, Any]) -> set[str]:
    return {call["name"] for m in conversation["messages"] for call in m.get("tool_calls", ())}


def choose_unseen_functions(conversations: list[dict[str, Any]], fraction: float, seed: int) -> set[str]:
    """The functions held out of training entirely (see the module docstring)."""
    candidates = sorted(set().union(*(functions_called(c) for c in conversations)))
    if fraction <= 0 or len(candidates) < 2:
        return set()
    random.Random(f"gpuval-unseen:{seed}").shuffle(candidates)
    records_of: dict[str, set[int]] = {}
    for index, conversation in enumerate(conversations):
        for name in functions_named(conversation):
            records_of.setdefault(name, set()).add(index)
    budget = round(fraction * len(conversations))
    held: set[str] = set()
    touched: set[int] = set()
    for name in candidates[:-1]:  # never every called function: train keeps at least one
        if len(touched | records_of[name]) <= budget:
            held.add(name)
            touched |= records_of[name]
    if not held:
        fewest = min(candidates[:-1], key=lambda n: len(records_of[n]))
        if len(records_of[fewest]) < len(conversations):
            held.add(fewest)
    return held


def split_records(
    conversations: list[dict[str, Any]], unseen_functions: set[str], eval_fraction: float, seed: int
) -> dict[str, list[dict[str, Any]]]:
    unseen: list[dict[str, Any]] = []
    rest: list[int] = []
    for index, conversation in enumerate(conversations):
        if not functions_named(conversation) & unseen_functions:
            rest.append(index)
        elif functions_called(conversation) <= unseen_functions:
            unseen.append(conversation)
    chosen = set(random.Random(f"gpuval-eval:{seed}").sample(rest, round(eval_fraction * len(rest))))
    return {
        "train": [conversations[i] for i in rest if i not in chosen],
        "eval": [conversations[i] for i in rest if i in chosen],
        "eval_unseen": unseen,
    }
