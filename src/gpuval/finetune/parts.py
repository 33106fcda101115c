"""The contract of everything that changes the fine-tune's step (issues 35 and 52).

Each optional change of the model or of how it is run (fused q/k/v, the FP8 frozen base, activation
checkpointing, compiling the decoder layers, how FSDP2 and ZeRO-3 move the weights, ...) is one `Part`, in
its own module, with one contract (after torchtitan's model converters, `register_model_converter`, applied
in list order):

- `name`: the part's name in the log (`step parts: fused_qkv on (auto: GPU, ddp); ...`);
- `stage`: where in the build it is applied (`STAGES`, in this order): `base` (the bare transformers model,
  before LoRA), `lora` (after LoRA, before the move to the device: how the weights will be held, and
  activation checkpointing from that), `adapted` (after the move, before compiling), `compile` (the
  decoder layers, once every part that changes modules inside them has run), `wrapped` (after the parallel
  wrapper is made, before the first forward: `model` is then the wrapper's engine);
- `decide(ctx)`: does it apply here: a `Decision` (on or off, the resolved choice where `auto` chose, and
  a one-line reason). A choice set explicitly that cannot run here is a UsageError naming what to set;
- `apply(model, ctx, decision)`: called only when the decision is on; changes the model in place and returns
  what the part reports (keys of its declared `reports`, which also say what it reports when off);
- its docstring: when it applies and why not, what it changes, what it reports, what must come before or
  after it.

Every part decides before the model loads (a refused choice costs no minutes of loading), in the declared
order of `step.PARTS`, so a decision may read those made before it (`ctx.decisions`); a part whose decision
parts before it read (`decided_first`: compile, whose choice the kernels' decisions read) decides first.
A choice that needs the loaded model (`auto` of activation checkpointing, from the step's memory estimate)
is made in `apply`, which then returns it in its reports and settles the decision (`ctx.settle`). One
function, `step.apply_parts`, applies the parts of a stage in PARTS order. docs/step-parts.md says how to
add one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gpuval.finetune.config import ExperimentalSettings, LoraSettings, ShardingSettings, StepSettings

Stage = Literal["base", "lora", "adapted", "compile", "wrapped"]
STAGES: tuple[Stage, ...] = ("base", "lora", "adapted", "compile", "wrapped")  # the build's order


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
    said: bool = True  # False: nothing to do under this run's mode (a ZeRO-3 switch under ddp), unsaid

    def line(self, name: str) -> str:
        choice = f" {self.choice}" if isinstance(self.choice, str) else ""
        return f"{name} {'on' if self.on else 'off'}{choice} ({self.why})"


@dataclass(frozen=True)
class RowLayout:
    """How the loop lays out a micro-batch's packed rows, as the parts decided it (a typed value, never a
    report read back): the attention part sets it when it routes attention through varlen."""

    varlen: bool = False  # one row of documents by cu_seq_lens and no mask; else the dense document mask
    whole_rows: bool = False  # with varlen: rows holding one whole document stay rows (their own kernel)


@dataclass(frozen=True)
class WeightPlan:
    """How the parallel mode will hold the frozen base's weights, as the sharding parts decided it (stage
    `lora`): read by activation checkpointing's memory estimate and by the parallel wrapper."""

    fsdp_reshard: bool = False  # fsdp: decoder layers (all but the last) reshard after their forward
    zero3_leaves: tuple[Any, ...] = ()  # deepspeed stage 3: frozen submodules fetched whole
    sharded: bool = False  # each rank holds 1/world of the base's weights while it waits (step/memory.py)


@dataclass
class StepContext:
    """What the parts' decisions read, and what they leave for the parts after them and for the loop."""

    step: StepSettings
    experimental: ExperimentalSettings
    lora: LoraSettings
    parallel: str  # train.parallel: ddp, fsdp or deepspeed
    on_gpu: bool
    compiled: bool  # decoder layers compiled after the parts (the compile part's decision, made first)
    dtype: str  # the base weights' dtype name: bfloat16 or float32
    sharding: ShardingSettings = field(default_factory=ShardingSettings)  # train.sharding
    zero_stage: int | None = None  # parallel deepspeed: the ZeRO stage of its JSON; else None
    world_size: int = 1
    device: Any = None  # this rank's torch.device
    micro_batch_tokens: int = 0  # token slots per micro-batch: micro_batch_size x max_seq_len
    gpu_name: str | None = None  # torch.cuda.get_device_name; None on a CPU
    capability: tuple[int, int] | None = None  # torch.cuda.get_device_capability; None on a CPU
    tied_head: bool = False  # the model's output head shares the input embeddings' weight
    decisions: dict[str, Decision] = field(default_factory=dict)  # the parts decided so far, by name
    layers: list[Any] = field(default_factory=list)  # the decoder layers (set after LoRA, before `lora`)
    # What the training loop uses per micro-batch, left by parts: "loss_head", "last_mlp_rows"
    hooks: dict[str, Any] = field(default_factory=dict)
    # Words for the start-up line, by part name (e.g. "q/k/v fused in 28 attention layers")
    details: dict[str, str] = field(default_factory=dict)
    layout: RowLayout = RowLayout()  # the batches' layout (batches.step_batches_for)
    weights: WeightPlan = WeightPlan()  # how the parallel mode holds the base's weights (sharding parts)
    # How the parallel mode moves the weights, a phrase each, in the order said (the sharding parts', then
    # the wrapper's own): the start-up line and the summary's `sharding`
    weight_notes: list[str] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)  # values a part computes once for others
    # lines of decisions a part settled when applied (a choice that needed the loaded model), for the log
    settled: list[str] = field(default_factory=list)

    def settle(self, name: str, decision: Decision) -> None:
        """Part `name`'s decision as its `apply` resolved it (`auto` that needed the loaded model)."""
        self.decisions[name] = decision
        self.settled.append(decision.line(name))

    @property
    def zero3(self) -> bool:
        """deepspeed with ZeRO stage 3: the weights are partitioned, gathered from hooks."""
        return self.parallel == "deepspeed" and self.zero_stage == 3

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
    decided_first: ClassVar[bool] = False  # parts before it in PARTS read its decision: it decides first

    @abstractmethod
    def decide(self, ctx: StepContext) -> Decision:
        """Does the part apply here (see the module docstring)."""

    @abstractmethod
    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        """Change `model` in place (only when decided on) and return the part's reports."""

    def off_report(self, decision: Decision) -> dict[str, Any]:
        """What the part reports when it did not run: its declared values, a callable given the decision."""
        return {key: value(decision) if callable(value) else value for key, value in self.reports.items()}
