"""A fine-tune's console: gpuval's lines and a progress bar per eval split, the libraries' warnings and
loading bars in the run's third_party.log instead."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from conftest import TINY_CPU_RUN

pytest.importorskip("transformers")
pytest.importorskip("peft")

# What the libraries would print without gpuval's routing: Python warnings (FutureWarning, UserWarning,
# and the `warnings.warn(` source line under them) and transformers' "Loading weights" bar.
CHATTER = re.compile(r"Warning|warnings\.warn|Loading|it/s\]")


@pytest.mark.slow
@TINY_CPU_RUN
def test_finetune_run_shows_progress_per_split_and_sends_library_chatter_to_the_log(tiny_cpu_run):
    """`finetune run` trains and evaluates the tiny model: transformers loads it with its "Loading weights"
    bar, and peft raises a FutureWarning and logs a warning on the way (tests/dist/warnhook makes it do so
    whatever its release; all of it appears on stderr without the routing), yet stderr holds none of it;
    the log file holds both warnings; and stderr shows one bar per split and model that finished that
    split's examples."""
    result, run = tiny_cpu_run
    assert result.returncode == 0, result.stderr[-3000:]
    noisy = [line for line in result.stderr.splitlines() if CHATTER.search(line)]
    assert not noisy, "\n".join(noisy)
    log = run / "third_party.log"
    assert log.is_file(), "nothing reached the run's log file"
    logged = log.read_text(encoding="utf-8")
    assert "FutureWarning: get_peft_model's old argument is deprecated" in logged
    assert "peft WARNING: peft logger: get_peft_model's old argument" in logged
    document = json.loads((run / "eval.json").read_text(encoding="utf-8"))
    for split, variants in document["splits"].items():
        for variant, metrics in variants.items():
            n = metrics["examples"]
            bar = rf"^eval {split} \({variant}\)\s.*\s{n}/{n}\s.*examples/s"
            assert re.search(bar, result.stderr, re.MULTILINE), (split, variant, result.stderr)
    assert document["splits"]["eval"]["tuned"]["examples"] > 0  # a bar that counted something


# --- the bars, without a model -----------------------------------------------------------------------


@dataclass
class FakeRuntime:
    """One rank of `world_size`, for a split of `records` records (the gather fills in the others)."""

    records: int
    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather_object(self, part):
        # the other ranks' shares as empty strings, so the gathered predictions cover every record
        others = [
            [(i, "") for i in range(rank, self.records, self.world_size)]
            for rank in range(self.world_size)
            if rank != self.rank
        ]
        return [part, *others]


class RecordingProgress:
    """Stands in for rich's Progress: what evaluate() asked of the bars."""

    def __init__(self) -> None:
        self.tasks: dict[int, dict] = {}
        self.stopped = False

    def add_task(self, description: str, total=None) -> int:
        self.tasks[len(self.tasks)] = {"description": description, "total": total, "done": 0}
        return len(self.tasks) - 1

    def update(self, task: int, total=None) -> None:
        self.tasks[task]["total"] = total

    def advance(self, task: int, n: int) -> None:
        self.tasks[task]["done"] += n

    def stop(self) -> None:
        self.stopped = True


def _record(i: int) -> dict:
    return {
        "tools": [],
        "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "no call"}],
    }


def _evaluate(monkeypatch, runtime: FakeRuntime, splits: dict, show_progress: bool = True):
    from gpuval.finetune.eval import evaluate as ev

    bars = RecordingProgress()
    made = []
    monkeypatch.setattr(ev, "_progress", lambda: made.append(bars) or bars)
    monkeypatch.setattr(ev, "render_prompt", lambda prompt, tokenizer: prompt["messages"][-1]["content"])

    def fake_generate(model, tokenizer, prompts, batch_size, max_new_tokens, device, advance):
        for start in range(0, len(prompts), batch_size):
            advance(len(prompts[start : start + batch_size]))
        return ["no call"] * len(prompts)

    monkeypatch.setattr(ev, "generate", fake_generate)
    model = SimpleNamespace(eval=lambda: None)
    result = ev.evaluate(
        model,
        None,
        splits,
        runtime,
        batch_size=2,
        base_too=False,
        log=lambda *_: None,
        show_progress=show_progress,
    )
    return result, (made[0] if made else None)


def test_each_split_gets_a_bar_whose_total_is_this_ranks_share(monkeypatch):
    splits = {"eval": [_record(i) for i in range(5)], "holdout_values": [_record(i) for i in range(5)]}
    result, bars = _evaluate(monkeypatch, FakeRuntime(records=5), splits)
    assert result["splits"]["eval"]["tuned"]["examples"] == 5
    assert [(t["description"], t["total"], t["done"]) for t in bars.tasks.values()] == [
        ("eval eval (tuned)", 5, 5),
        ("eval holdout_values (tuned)", 5, 5),
    ]
    assert bars.stopped


def test_only_the_printing_rank_draws_bars_and_each_counts_its_own_share(monkeypatch):
    splits = {"eval": [_record(i) for i in range(5)]}
    first = FakeRuntime(records=5, rank=0, world_size=2)
    _, bars = _evaluate(monkeypatch, first, splits)
    assert [(t["total"], t["done"]) for t in bars.tasks.values()] == [(3, 3)]  # records 0, 2, 4
    second = FakeRuntime(records=5, rank=1, world_size=2)
    assert _evaluate(monkeypatch, second, splits)[1] is None  # no bar on rank 1
    assert _evaluate(monkeypatch, first, splits, show_progress=False)[1] is None


def test_the_bars_stop_when_a_split_fails(monkeypatch):
    from gpuval.finetune.eval import evaluate as ev

    bars = RecordingProgress()
    monkeypatch.setattr(ev, "_progress", lambda: bars)

    def broken(*_args, **_kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(ev, "evaluate_split", broken)
    runtime = FakeRuntime(records=1)
    with pytest.raises(RuntimeError, match="out of memory"):
        ev.evaluate(SimpleNamespace(eval=lambda: None), None, {"eval": [_record(0)]}, runtime, base_too=False)
    assert bars.stopped


def test_examples_per_second_is_the_splits_average():
    """Examples done over the time taken, from the first update on: rich's own estimate needs two updates,
    and a small split, or a slow first batch, has one."""
    from gpuval.finetune.eval import evaluate as ev

    progress = ev._progress()
    progress.stop()
    (column,) = [c for c in progress.columns if type(c).__name__ == "ExamplesPerSecond"]
    assert column.render(SimpleNamespace(completed=6, elapsed=2.0)).plain == "3.0 examples/s"
    assert column.render(SimpleNamespace(completed=0, elapsed=2.0)).plain == "- examples/s"
    assert column.render(SimpleNamespace(completed=6, elapsed=None)).plain == "- examples/s"
