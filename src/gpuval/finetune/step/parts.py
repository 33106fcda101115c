"""The training step's parts: one contract for every optimisation of the step (issue 35).

Each optional change of the model (fused q/k/v, split products, the FP8 frozen base, …) is one `Part`, in
its optimisation's own module, with one contract (after torchtitan's model converters,
`register_model_converter`, which it applies in list order):

- `name`: the part's name in the log (`step parts: fused_qkv on (auto: GPU, ddp); …`);
- `stage`: `base` (applied to the bare transformers model, before LoRA) or `adapted` (after LoRA and the
  move to the device, before compiling);
- `decide(ctx)`: does it apply here: a `Decision` (on or off, the resolved choice where `auto` chose, and
  a one-line reason). A choice set explicitly that cannot run here is a UsageError naming what to set;
- `apply(model, ctx, decision)`: called only when the decision is on; changes the model in place and returns
  what the part reports (keys of its declared `reports`, which also say what it reports when off);
- its docstring: when it applies and why not, what it changes, what it reports, what must come before or
  after it.

Every part decides before the model loads (a refused choice costs no minutes of loading), in the declared
order of `step.PARTS`, so a decision may read those made before it (`ctx.decisions`). One function,
`step.apply_parts`, applies them in that order. docs/step-parts.md says how to add one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gpuval.finetune.config import ExperimentalSettings, LoraSettings, StepSettings

Stage = Literal["base", "adapted"]


@dataclass(frozen=True)
class Decision:
    """A part's decision: `on`, the `choice` it resolved (`auto` resolved: a kernel name, True/False), and
    `why` in one line. `settings`: further choices it resolved (the attention part's kernels, FP8's
    options). `note`: a line said on stderr on the main rank even in a quiet run (a part off because of the
    parallel mode, a missing package): what costs speed is never silent."""

    on: bool
    choice: Any
    why: str
    settings: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    def line(self, name: str) -> str:
        shown = f" {self.choice}" if isinstance(self.choice, str) else ""
        return f"{name} {'on' if self.on else 'off'}{shown} ({self.why})"


@dataclass(frozen=True)
class RowLayout:
    """How the loop lays out a micro-batch's packed rows, as the parts decided it (a typed value, never a
    report read back): the attention part sets it when it routes attention through varlen."""

    varlen: bool = False  # one row of documents by cu_seq_lens and no mask; else the dense document mask
    whole_rows: bool = False  # with varlen: rows holding one whole document stay rows (their own kernel)


@dataclass
class StepContext:
    """What the parts' decisions read, and what they leave for the parts after them and for the loop."""

    step: StepSettings
    experimental: ExperimentalSettings
    lora: LoraSettings
    parallel: str  # train.parallel: ddp, fsdp or deepspeed
    on_gpu: bool
    compiled: bool  # decoder layers compiled after the parts (train.step.compile, resolved up front)
    dtype: str  # the base weights' dtype name: bfloat16 or float32
    gpu_name: str | None = None  # torch.cuda.get_device_name; None on a CPU
    capability: tuple[int, int] | None = None  # torch.cuda.get_device_capability; None on a CPU
    tied_head: bool = False  # the model's output head shares the input embeddings' weight
    decisions: dict[str, Decision] = field(default_factory=dict)  # the parts decided so far, by name
    layers: list[Any] = field(default_factory=list)  # the decoder layers (set before the adapted stage)
    # What the training loop uses per micro-batch, left by parts: "loss_head", "last_mlp_rows"
    hooks: dict[str, Any] = field(default_factory=dict)
    # Words for the start-up line, by part name (e.g. "q/k/v fused in 28 attention layers")
    details: dict[str, str] = field(default_factory=dict)
    layout: RowLayout = RowLayout()  # the batches' layout (batches.step_batches_for)
    shared: dict[str, Any] = field(default_factory=dict)  # values a part computes once for others

    def auto_on_gpu_under_ddp(self, name: str, why: str) -> Decision:
        """`auto` of a part that runs on a GPU under ddp only (`why`: what the other modes lack)."""
        if not self.on_gpu:
            return Decision(False, False, "auto: CPU")
        if self.parallel != "ddp":
            return self.off_under_parallel(name, why)
        return Decision(True, True, "auto: GPU, ddp")

    def off_under_parallel(self, name: str, why: str = "") -> Decision:
        """`auto` off because of the parallel mode: said in the parts line and on stderr. `why`: what the
        part needs that this mode lacks, e.g. ": it concatenates weights that fsdp shards"."""
        reason = f"auto: not under {self.parallel}{why}"
        note = f"step parts: {name} off under train.parallel={self.parallel} ({reason})"
        return Decision(False, False, reason, note=note)


class Part(ABC):
    """The contract of the step's parts (module docstring), an abstract base: a part that leaves out
    `decide` or `apply` cannot be made. Subclasses set `name`, `stage` and `reports` (summary key -> the
    value reported when the part is off, or a callable of the decision giving it)."""

    name: ClassVar[str]
    stage: ClassVar[Stage]
    reports: ClassVar[dict[str, Any]]

    @abstractmethod
    def decide(self, ctx: StepContext) -> Decision:
        """Does the part apply here (see the module docstring)."""

    @abstractmethod
    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        """Change `model` in place (only when decided on) and return the part's reports."""

    def off_report(self, decision: Decision) -> dict[str, Any]:
        """What the part reports when it did not run: its declared values, a callable given the decision."""
        return {key: value(decision) if callable(value) else value for key, value in self.reports.items()}
