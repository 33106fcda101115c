"""A fine-tune's evaluation for people: the table of scores (eval.json's splits) and the progress bars
gpuval.finetune.eval.evaluate advances while it generates."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from gpuval.report.console import WholeLineProgress

# The metrics a person reads first, in the table's column order, with short headers that fit 80 columns.
TABLE_METRICS = (
    ("exact_call_accuracy", "exact"),
    ("ast_accuracy", "AST"),
    ("call_f1", "call F1"),
    ("json_validity", "JSON ok"),
    ("name_accuracy", "name"),
    ("argument_exact_match", "args EM"),
    ("argument_f1", "args F1"),
)


def eval_table(result: dict[str, Any]) -> Table:
    """One row per split and model variant, the headline metrics as columns."""
    table = Table(
        title="function-calling evaluation (exact = exact_call_accuracy; AST = BFCL's AST match)",
        title_justify="left",
        caption="args EM: expected calls matched exactly; F1s over calls made and argument slots",
        caption_justify="left",
    )
    table.add_column("split")
    table.add_column("model")
    table.add_column("n", justify="right")
    for _metric, header in TABLE_METRICS:
        table.add_column(header, justify="right")
    for split, variants in result["splits"].items():
        for variant, metrics in variants.items():
            cells = [_score(metrics.get(metric)) for metric, _header in TABLE_METRICS]
            table.add_row(split, variant, str(metrics["examples"]), *cells)
    return table


def _score(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}"


class ExamplesPerSecond(ProgressColumn):
    def render(self, task: Any) -> Text:
        # the split's average so far: rich's own estimate needs two updates, and a small split has one
        elapsed = task.elapsed
        speed = task.completed / elapsed if task.completed and elapsed else None
        return Text(f"{speed:.1f} examples/s" if speed else "- examples/s")


def eval_progress() -> WholeLineProgress:
    """Started bars on stderr, one per task (split and model): examples done of this rank's share,
    examples/s, elapsed."""
    progress = WholeLineProgress(
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        ExamplesPerSecond(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    progress.start()
    return progress
