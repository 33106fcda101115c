"""The fine-tune config: strict YAML (an unknown key is an error naming it), with --set overrides.

    model: tiny                      # a local folder, a hub name, `tiny` (bundled) or `qwen2-7b-shape`
    tokenizer: null                  # default: the model's; needed for a shape-only model
    dtype: bfloat16                  # weights of the frozen base model; LoRA adapters stay float32
    lora: {rank: 64, alpha: 128, dropout: 0.05, target_modules: [q_proj, k_proj, v_proj, o_proj]}
    data: {train: DIR/train.jsonl, eval: DIR/eval.jsonl, max_seq_len: 4096}
    train: {micro_batch_size: 2, grad_accum_steps: 4, max_steps: 100, optim: {lr: 2.0e-5, ...},
            step: {compile: auto, ...}, ...}   # sections: optim, save, log, step, experimental
    output: runs/qwen2-7b-lora
    synth: {n: 2000, holdout_n: 200} # optional, for `finetune run`: synthetic data first
    prepare: {input: "{output}/synth/glaive.jsonl", eval_fraction: 0.02}   # optional, for `finetune run`
    eval: {batch_size: 16, max_new_tokens: 256, max_examples: 200}

`{output}` in any path is replaced by `output` (after --set), so `finetune run --output DIR` moves the whole
run. Validation and error messages are those of profiles (gpuval.config.validate_model, apply_sets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from gpuval.config import Number, apply_sets, read_yaml, validate_model

# Products of the frozen base weights (`train.step.precision`; finetune/step/fp8.py): the one list of them.
Precision = Literal["bf16", "fp8-base"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LoraSettings(_Strict):
    rank: StrictInt = Field(64, ge=1, description="LoRA rank r")
    alpha: Number = Field(128.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank")
    dropout: Number = Field(0.05, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], description="linear module names, or 'all-linear'"
    )
    trainable_tokens: list[str] = Field(
        default_factory=list,
        description="tokens whose embedding rows train too (PEFT trainable_token_indices): tokens the base "
        "never learned, such as tool-call tags added to its vocabulary",
    )


class DataSettings(_Strict):
    train: str = Field(description="prepared JSONL ({'tools', 'messages'} per line), see `finetune prepare`")
    eval: str | None = Field(None, description="prepared JSONL for evaluation; not read by training")
    max_seq_len: StrictInt = Field(4096, ge=8, description="tokens per packed sequence")


class SynthSettings(_Strict):
    n: StrictInt = Field(ge=1, description="synthetic Glaive records for training and in-distribution eval")
    seed: StrictInt = Field(0, description="seed of the training records")
    values: Literal["all", "train", "holdout", "synthetic", "pieces"] = Field(
        "train",
        description="argument value pool part; 'synthetic': made-up values, never held-out ones, that can "
        "only be copied from the request; 'pieces': the same, half the text ones built from the "
        "tokenizer's word pieces",
    )
    holdout_n: StrictInt = Field(
        0, ge=0, description="extra records with held-out argument values, for the 'holdout_values' split"
    )
    holdout_seed: StrictInt = Field(1, description="seed of the held-out-values records")


class PrepareSettings(_Strict):
    input: str = Field("{output}/synth/glaive.jsonl", description="Glaive file or datasets name")
    output: str = Field("{output}/data", description="folder for train/eval/eval_unseen.jsonl")
    eval_fraction: Number = Field(0.02, ge=0, lt=1, description="in-distribution eval share")
    unseen_fraction: Number | None = Field(None, ge=0, lt=1, description="unseen-function share")
    seed: StrictInt = Field(0, description="seed of the splits")


class EvalSettings(_Strict):
    splits: dict[str, str] = Field(
        default_factory=dict,
        description="split name -> prepared JSONL; empty: data.eval, eval_unseen.jsonl beside it, and "
        "the held-out-values split when synth makes one",
    )
    batch_size: StrictInt = Field(16, ge=1, description="prompts per generate() call per rank")
    max_new_tokens: StrictInt = Field(256, ge=1, description="generation length limit")
    max_examples: StrictInt | None = Field(200, ge=1, description="first N examples of each split")
    base_model: bool = Field(True, description="also score the base model (adapter off)")
    base_max_examples: StrictInt | None = Field(
        None,
        ge=1,
        description="the base model on the first N examples of each split only (null: as many as the tuned "
        "one); the base is the reference the tuned score is read against, and its generations are the "
        "slowest (it seldom stops before max_new_tokens)",
    )


class OptimSettings(_Strict):
    """The optimizer and its schedule (finetune/optim.py)."""

    lr: Number = Field(
        2e-5, gt=0, le=1.0, description="peak learning rate, reached after warm-up (AdamW: above 1 diverges)"
    )
    warmup_steps: StrictInt = Field(10, ge=0, description="optimizer steps of linear warm-up from 0")
    weight_decay: Number = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: Number = Field(1.0, ge=0, description="max global grad norm (L2); 0 turns clipping off")


class SaveSettings(_Strict):
    """Checkpoints (finetune/checkpoint.py)."""

    every_steps: StrictInt = Field(0, ge=0, description="checkpoint period in steps; 0: none")
    keep_last: StrictInt = Field(2, ge=1, description="checkpoints kept; older ones are deleted")


class LogSettings(_Strict):
    """What the run tells: console lines, TensorBoard events, a profile."""

    every_steps: StrictInt = Field(1, ge=1, description="print a progress line every N steps")
    tensorboard: bool = Field(True, description="write TensorBoard events under OUTPUT/tensorboard")
    profile_steps: StrictInt = Field(
        0,
        ge=0,
        description="PyTorch-profile this many steps after the first two: OUTPUT/profile/trace.json "
        "(Perfetto) and operators.txt",
    )
    profile_stack: bool = Field(
        False,
        description="the profile records the Python functions too (the profiler's with_stack): names the "
        "code behind host time; slower steps and a much larger trace",
    )


class Fp8Settings(_Strict):
    """The FP8 frozen base's options (`train.step.precision: fp8-base`; finetune/step/fp8.py)."""

    fast_accum: bool = Field(
        False,
        description="fp8-base: Hopper's fast FP8 accumulation in the forward products (torchao's default; "
        "faster, less exact: benchmarks/NOTES.md); the backward never uses it",
    )
    input_grad: bool = Field(
        True,
        description="fp8-base: the input-gradient products in FP8 too; false: in bf16 against the original "
        "weights (slower, one more byte per weight; benchmarks/NOTES.md)",
    )
    exclude: list[str] | None = Field(
        None,
        description="fp8-base: frozen linears kept in bf16, as glob patterns over names such as "
        "0.self_attn.q_proj or -1.mlp.down_proj (layer index from the start or the end, then the path "
        "in the layer); unset: the first and last layer ['0.*', '-1.*'], which keep the loss within 1 % of "
        "bf16's (benchmarks/NOTES.md); []: every product in FP8 (finetune/step/fp8.py)",
    )


class StepSettings(_Strict):
    """How the training step runs: its parts (finetune/parts.py, docs/step-parts.md). `auto` resolves per
    machine and parallel mode; the run's first lines say what each part resolved to and why."""

    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="recompute activations in backward; auto: only when the step would not fit the GPU "
        "without it (finetune/step/memory.py), never on a CPU",
    )
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile every decoder layer; auto: on a GPU under ddp or fsdp"
    )
    attention: Literal["auto", "sdpa", "varlen"] = Field(
        "auto",
        description="per-document attention: varlen (no mask: flash varlen on a GPU, SDPA per document on "
        "a CPU), sdpa (dense document mask); auto: varlen (finetune/step/attention.py)",
    )
    row_kernel: Literal["auto", "fa4", "cudnn", "flash", "varlen"] = Field(
        "auto",
        description="with varlen attention, rows that are one whole document each (fixed-length data): "
        "fa4 (FlashAttention-4, the flash-attn-4 package), cudnn or flash (causal SDPA per row with that "
        "backend) or varlen; auto on Hopper: fa4 where installed, else cudnn",
    )
    varlen_kernel: Literal["auto", "fa4", "flash"] = Field(
        "auto",
        description="with varlen attention, rows of packed documents: fa4 (FlashAttention-4, the "
        "flash-attn-4 package) or flash (varlen_attn, FlashAttention-2); auto on Hopper: fa4 where installed",
    )
    kernels: Literal["auto", "liger", "liger-loss", "torch"] = Field(
        "auto",
        description="liger: Liger-Kernel RMSNorm/SwiGLU/RoPE and the fused linear+cross-entropy (every "
        "parallel mode where the output head is not tied to the embeddings); "
        "liger-loss: the fused loss alone (gpuval's own unless loss_kernel=liger: no Liger needed); torch: "
        "transformers' own; auto: on a GPU liger-loss when compiled, else liger where installed",
    )
    loss_kernel: Literal["auto", "chunked", "liger"] = Field(
        "auto",
        description="the fused loss (train.step.kernels liger or liger-loss): chunked (gpuval's own, no "
        "host reads, 2,048-row chunks: finetune/step/linear_ce.py) or liger (Liger's fused linear "
        "cross-entropy); auto: chunked",
    )
    last_mlp_rows: Literal["labelled", "all"] = Field(
        "labelled",
        description="the last decoder layer's MLP on the rows the loss reads only (labelled), or on every "
        "row (all); the loss and gradients are the same (finetune/step/last_mlp_rows.py)",
    )
    fuse_qkv: bool | Literal["auto"] = Field(
        "auto",
        description="q, k and v with their LoRA adapters as one product and one dropout mask "
        "(finetune/step/fused_qkv.py); auto: on a GPU under ddp",
    )
    split_products: bool | Literal["auto"] = Field(
        "auto",
        description="every frozen linear's hidden-size side as two column groups (finetune/"
        "split_products.py: faster tiles on an H100); auto: on a GPU with compiled layers under ddp or fsdp",
    )
    dropout_kernel: Literal["auto", "packed", "torch"] = Field(
        "auto",
        description="LoRA's dropout: packed (its keep-mask drawn eight elements per random draw by "
        "gpuval's kernel, finetune/step/packed_dropout.py) or torch (nn.Dropout); auto: packed on a GPU with "
        "compiled layers",
    )
    precision: Precision = Field(
        "bf16",
        description="products of the frozen base weights: bf16, or fp8-base (FP8 with row-wise scales, "
        "Hopper GPUs under ddp; LoRA and all that trains stay bf16; finetune/step/fp8.py)",
    )
    fp8: Fp8Settings = Fp8Settings()


class ExperimentalSettings(_Strict):
    """Switches kept for experiments only: measured slower, off by default."""

    fuse_gate_up: bool | Literal["auto"] = Field(
        False,
        description="the MLP's frozen gate and up projections as one product over their concatenated "
        "weights; MLPs with LoRA on them stay as they are (finetune/step/fused_mlp.py); auto: on a GPU under "
        "ddp. Off by default: 0.7 % slower than two products in the bf16 step on one H100 "
        "(benchmarks/NOTES.md)",
    )


class ShardingSettings(_Strict):
    """How fsdp and ZeRO-3 move the sharded weights (parallel/sharding.py); `auto` resolves per model and
    GPU, and the run's start-up line says what it chose and why."""

    fsdp_reshard_after_forward: bool | Literal["auto"] = Field(
        "auto",
        description="FSDP2: free each decoder layer's gathered weights after its forward and gather them "
        "again for its backward (true; every layer but the last, whose backward follows at once, as "
        "torchtitan does) or keep them until its backward (false: one all-gather per micro-batch instead "
        "of two, the unsharded weights held meanwhile). auto: false on a GPU when the whole model's "
        "weights take at most a quarter of its memory, else true",
    )
    zero3_frozen_leaves: bool | Literal["auto"] = Field(
        "auto",
        description="ZeRO-3 (deepspeed, stage 3): fetch each frozen submodule of a decoder layer that has "
        "children of its own (Qwen2's MLP when LoRA targets the attention) whole, by one all-gather and "
        "without hooks on its children, instead of child by child. A submodule holding a trainable weight "
        "is never fetched whole (parallel/sharding.py says why). auto: false (measured: no difference "
        "within ZeRO-3's spread)",
    )
    zero3_whole_lora: bool | Literal["auto"] = Field(
        "auto",
        description="ZeRO-3 (deepspeed, stage 3): run each LoRA layer whose weights ZeRO-3 keeps whole on "
        "every rank (stage3_param_persistence_threshold) as one module, its base product, dropout, A and B "
        "called as functions, so ZeRO-3 runs its fetch hooks on one module instead of five; the arithmetic "
        "is PEFT's (parallel/sharding.py). auto: true (measured: 9 to 23 points of one GPU's rate more on "
        "2 GPUs, no difference on 4)",
    )
    zero3_unhook_whole: bool | Literal["auto"] = Field(
        "auto",
        description="ZeRO-3 (deepspeed, stage 3): take DeepSpeed's fetch hooks off every module that owns "
        "no partitioned weight (all its weights kept whole on every rank, or none: norms, activations, the "
        "attention and its LoRA layers under the shipped zero3.json), so they run only where there is "
        "something to fetch; the arithmetic is unchanged (parallel/sharding.py). auto: true (measured: "
        "70 to 72 % of one GPU's rate on 4 GPUs against 62 and 69 % with every module hooked)",
    )
    zero3_lean_step: bool | Literal["auto"] = Field(
        "auto",
        description="ZeRO-3 (deepspeed, stage 3): keep the weights ZeRO-3 keeps whole gathered through "
        "each optimizer step (DeepSpeed releases them and gathers each again by an all-gather of its own) "
        "and bring the trainable ones up to date in place by one all-gather; the update is DeepSpeed's "
        "(parallel/zero3_step.py). auto: true (measured on 4 GPUs: its first form 76 % of one GPU's rate "
        "against 71 and 72 % with DeepSpeed's step; as shipped 80.4 to 81.9 %)",
    )
    zero3_fused_epilogue: bool | Literal["auto"] = Field(
        "auto",
        description="ZeRO-3 (deepspeed, stage 3): reduce the adapter's gradients at the end of each backward "
        "by one multi-tensor copy, one reduce-scatter and one multi-tensor copy into the fp32 partitions, "
        "where DeepSpeed runs several operations per weight while the GPU waits; the arithmetic is "
        "DeepSpeed's (parallel/zero3_step.py). auto: false (measured: the step's longest idle gaps gone on 2 "
        "GPUs, its rate unchanged within ZeRO-3's spread on 2 and 4)",
    )
    zero3_compile_whole: bool | Literal["auto"] = Field(
        "auto",
        description="ZeRO-3 (deepspeed, stage 3): torch.compile each submodule of a decoder layer "
        "that owns weights, all kept whole on every rank (Qwen2's attention under the shipped zero3.json), "
        "while the layers stay eager for DeepSpeed's fetch hooks (parallel/sharding.py). auto: false "
        "(measured on one GPU: no gain, 4.6 GiB more)",
    )


class TrainSettings(_Strict):
    # Keys that moved into a section (issue 35): an unknown-key error names the new place.
    moved_keys: ClassVar[dict[str, str]] = {
        **{key: f"optim.{key}" for key in OptimSettings.model_fields},
        "save_every_steps": "save.every_steps",
        "keep_last": "save.keep_last",
        "log_every_steps": "log.every_steps",
        "tensorboard": "log.tensorboard",
        "profile_steps": "log.profile_steps",
        **{key: f"step.{key}" for key in StepSettings.model_fields if key != "fp8"},
        **{f"fp8_{key}": f"step.fp8.{key}" for key in Fp8Settings.model_fields},
        "fuse_gate_up": "experimental.fuse_gate_up",
    }

    micro_batch_size: StrictInt = Field(2, ge=1, description="packed sequences per forward pass per rank")
    grad_accum_steps: StrictInt = Field(4, ge=1, description="micro-batches per optimizer step per rank")
    max_steps: StrictInt = Field(100, ge=1, description="optimizer steps; cosine decays to 0 by then")
    seed: StrictInt = Field(0, description="seeds LoRA init, data order and dropout")
    parallel: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp", description="ddp (replicated base), fsdp (FSDP2 fully_shard) or deepspeed (ZeRO, see below)"
    )
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON (parallel: deepspeed)")
    sharding: ShardingSettings = ShardingSettings()
    optim: OptimSettings = OptimSettings()
    save: SaveSettings = SaveSettings()
    log: LogSettings = LogSettings()
    step: StepSettings = StepSettings()
    experimental: ExperimentalSettings = ExperimentalSettings()

    def global_batch(self, world: int) -> int:
        """Packed sequences per optimizer step over `world` ranks: micro-batch × accumulation × ranks,
        computed here and nowhere else (the trainer, DeepSpeed's train_batch_size, bench train's data)."""
        return self.micro_batch_size * self.grad_accum_steps * world


class FinetuneConfig(_Strict):
    model: str = Field(
        "tiny", description="model folder, hub name, 'tiny', or a shape such as 'qwen2-7b-shape'"
    )
    tokenizer: str | None = Field(None, description="tokenizer folder or name; default: the model's")
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="base model weight dtype")
    lora: LoraSettings = LoraSettings()
    data: DataSettings
    train: TrainSettings = TrainSettings()
    output: str = Field(description="run folder: checkpoints/ and adapter/ go here")
    synth: SynthSettings | None = None
    prepare: PrepareSettings | None = None
    eval: EvalSettings = EvalSettings()

    def with_output(self) -> FinetuneConfig:
        """A copy with `{output}` in every path replaced by `output`."""
        return FinetuneConfig.model_validate(_substitute(self.model_dump(), self.output))

    @property
    def tokenizer_source(self) -> str:
        return self.tokenizer or self.model


def load_finetune_config(path: str | Path, assignments: list[str] | None = None) -> FinetuneConfig:
    """Read, apply `--set key.path=value` overrides, validate; any problem is one UsageError line."""
    config_path = Path(path)
    data = read_yaml(config_path, kind="config")
    apply_sets(data, assignments or [], dotted_maps=())
    return validate_model(FinetuneConfig, data, f"config '{config_path}'").with_output()


def finetune_config_from_dict(data: dict[str, Any], source: str = "config") -> FinetuneConfig:
    return validate_model(FinetuneConfig, data, source).with_output()


def _substitute(value: Any, output: str) -> Any:
    if isinstance(value, str):
        return value.replace("{output}", output)
    if isinstance(value, dict):
        return {key: _substitute(item, output) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, output) for item in value]
    return value
