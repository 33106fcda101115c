"""`gpuval finetune`: synthetic data, preparation, LoRA training, evaluation, and all of it in one run."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from gpuval import launch
from gpuval.cli.options import (
    Command,
    FinetuneNprocOption,
    Group,
    SetOption,
    console,
    exits,
    is_first_rank,
    output_dir,
    output_file,
    say,
)
from gpuval.errors import EXIT_PASS

finetune_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="Fine-tune for function calling: synthetic data, preparation, LoRA training, evaluation, all of it.",
)

ConfigOption = Annotated[Path, typer.Option(metavar="FILE", help="fine-tune config YAML (configs/finetune/)")]


@finetune_app.command("synth", cls=Command)
@exits
def finetune_synth(
    n: Annotated[int, typer.Option("--n", metavar="N", min=1, help="number of records")],
    output: Annotated[Path, output_file("the records (JSONL, or a JSON list with --format json)")],
    seed: Annotated[int, typer.Option(metavar="N", help="same seed, same records")] = 0,
    format_: Annotated[
        Literal["jsonl", "json", "openai"],
        typer.Option(
            "--format",
            metavar="jsonl|json|openai",
            help="Glaive records as JSONL or a JSON list; openai: OpenAI tool-format JSONL whose calls carry "
            "BFCL-style acceptable answers (other spellings of a value, optional parameters left out)",
        ),
    ] = "jsonl",
    values: Annotated[
        Literal["all", "train", "holdout", "synthetic", "pieces"],
        typer.Option(
            metavar="POOL",
            help="argument values from: all; train or holdout (the two never share a value); synthetic: "
            "made-up values, never held-out ones; pieces: the same, half the text ones from --tokenizer's "
            "word pieces",
        ),
    ] = "all",
    tokenizer: Annotated[
        str,
        typer.Option(
            metavar="DIR|NAME", help="tokenizer folder or name whose word pieces --values pieces uses"
        ),
    ] = "tiny",
) -> int:
    """Synthetic function-calling records in Glaive v2's own format, quirks included (or, with --format
    openai, the same conversations in the OpenAI tool format with acceptable answers)."""
    from gpuval.finetune.data.synth import value_part, write_synth

    path = write_synth(n, output, seed, format_, value_part(values, tokenizer))
    say(f"wrote {n} records to {path}", err=True)
    return EXIT_PASS


@finetune_app.command("prepare", cls=Command)
@exits
def finetune_prepare(
    input_: Annotated[
        str,
        typer.Option(
            "--input",
            metavar="FILE|NAME",
            help="Glaive or OpenAI tool-format .json/.jsonl file, or a datasets name",
        ),
    ],
    output: Annotated[Path, output_dir("train/eval/eval_unseen.jsonl and stats.json")],
    eval_fraction: Annotated[
        float, typer.Option(metavar="FRACTION", help="in-distribution eval share of the records")
    ] = 0.02,
    unseen_fraction: Annotated[
        float | None,
        typer.Option(
            metavar="FRACTION", help="most records held out with unseen functions (default: eval share)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(metavar="N", help="seed of the splits")] = 0,
    format_: Annotated[
        Literal["auto", "glaive", "openai"],
        typer.Option(
            "--format",
            metavar="auto|glaive|openai",
            help="record format: glaive ({system, chat}), openai (OpenAI/TRL {messages, tools}), "
            "or auto: what the first records look like",
        ),
    ] = "auto",
    json_: Annotated[bool, typer.Option("--json", help="print stats.json to stdout")] = False,
) -> int:
    """Glaive or OpenAI tool-format records to {"tools", "messages"} JSONL: train, eval and eval_unseen
    splits; skipped counted."""
    from gpuval.finetune.data.prepare import prepare

    stats = prepare(input_, output, eval_fraction, seed, unseen_fraction, format_)
    if json_:
        sys.stdout.write(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
        return EXIT_PASS
    splits = ", ".join(f"{name} {count}" for name, count in stats["splits"].items())
    reasons = ", ".join(f"{reason} {count}" for reason, count in stats["skipped_by_reason"].items())
    say(
        f"{stats['kept']} of {stats['total']} records kept ({stats['format']}; {splits}); "
        f"skipped {stats['skipped']}" + (f" ({reasons})" if reasons else "") + f"; wrote {output}"
    )
    return EXIT_PASS


@finetune_app.command("train", cls=Command)
@exits
def finetune_train(
    config: ConfigOption,
    set_: SetOption = [],  # noqa: B006 - typer reads the default, never mutates it
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the newest checkpoint in the output folder")
    ] = False,
    nproc: FinetuneNprocOption = None,
) -> int:
    """LoRA training (DDP, FSDP2 or DeepSpeed; torchrun/srun, or one rank per local GPU) -> OUTPUT/adapter."""
    return _finetune(config, set_, nproc, data=False, train=True, resume=resume, evaluate=False)


@finetune_app.command("eval", cls=Command)
@exits
def finetune_eval(
    config: ConfigOption,
    set_: SetOption = [],  # noqa: B006
    adapter: Annotated[
        Path | None, typer.Option(metavar="DIR", help="PEFT adapter folder (default: OUTPUT/adapter)")
    ] = None,
    nproc: FinetuneNprocOption = None,
) -> int:
    """Greedy generation on the eval splits, function-calling scores for the tuned and base model."""
    return _finetune(
        config, set_, nproc, data=False, train=False, resume=False, evaluate=True, adapter=adapter
    )


@finetune_app.command("run", cls=Command)
@exits
def finetune_run(
    config: ConfigOption,
    output: Annotated[Path | None, output_dir("the whole run", "the config's output")] = None,
    set_: SetOption = [],  # noqa: B006
    nproc: FinetuneNprocOption = None,
) -> int:
    """synth (when configured) -> prepare -> train -> eval, end to end; writes OUTPUT/eval.json."""
    sets = [*set_, f"output={output}"] if output else list(set_)
    return _finetune(config, sets, nproc, data=True, train=True, resume=False, evaluate=True)


def _finetune(
    config: Path,
    sets: list[str],
    nproc: int | None,
    *,
    data: bool,
    train: bool,
    resume: bool,
    evaluate: bool,
    adapter: Path | None = None,
) -> int:
    """The fine-tune steps asked for, on every rank of one process group (rank 0 alone makes data)."""
    from gpuval.atomic import ensure_writable_dir, missing_folders, remove_empty_folders
    from gpuval.finetune.config import load_finetune_config

    cfg = load_finetune_config(config, sets)  # a bad config is exit 2 before any rank starts
    inputs = None
    if evaluate and not train:  # a bad adapter or split too, before anything is made or loaded
        from gpuval.finetune.pipeline import eval_inputs

        inputs = eval_inputs(cfg, adapter)
    made = missing_folders(cfg.output)  # a failed command takes away the folders it made
    if is_first_rank():  # every step writes there (data, adapter, eval.json): say it now
        ensure_writable_dir(Path(cfg.output))
    # One trainer per output folder: a second one is exit 2. The process that starts the run holds the lock
    # (gpuval's launcher, not its ranks; rank 0 under torchrun/srun) until the run ends or it dies.
    from gpuval.runtime import distributed_env

    first = distributed_env()["rank"] == 0  # RANK under torchrun, SLURM_PROCID under srun
    locked = train and first and launch.EXIT_DIR_VARIABLE not in os.environ
    if locked:
        from gpuval.finetune.lock import lock_output

        lock_output(cfg.output)

    def work() -> int:
        from gpuval.deadline import FIRST_STEP_S, phase, watching
        from gpuval.finetune.pipeline import make_data, run_eval
        from gpuval.finetune.trainer import train as train_lora
        from gpuval.quiet import route_third_party_output
        from gpuval.runtime import init_runtime

        runtime = init_runtime(log_dir=cfg.output)
        route_third_party_output(cfg.output, runtime.rank)  # warnings and loading bars: to a file
        with watching(runtime), contextlib.ExitStack() as finally_:
            finally_.callback(runtime.shutdown)  # leaves the group on the way out, still watched
            if data:
                if runtime.is_main:
                    make_data(cfg)
                runtime.barrier()
            if train:
                # the model's build and first step; then each step is a phase of its own (trainer.py)
                with phase("train setup", FIRST_STEP_S):
                    summary = train_lora(cfg, runtime, resume=resume)
                if runtime.is_main:
                    last = summary["steps"][-1] if summary["steps"] else {}
                    say(
                        f"trained {summary['final_step']} steps on {summary['world_size']} rank(s); "
                        f"final loss {last.get('loss', float('nan')):.4f}; adapter {summary['adapter']}"
                    )
            if evaluate:
                from gpuval.report.finetune import eval_table

                document = run_eval(cfg, runtime, adapter, inputs)
                if document is not None:
                    console.print(eval_table(document))
                    say(f"wrote {Path(cfg.output) / 'eval.json'}")
        return EXIT_PASS

    # one rank per GPU; one process on a CPU (ranks there would share its few cores)
    ranks = nproc if nproc is not None else launch.default_nproc(cpu_ranks=1)
    code = None
    try:
        code = launch.run_distributed(ranks, work)
        return code
    finally:
        if locked:
            from gpuval.finetune.lock import unlock_output

            unlock_output(cfg.output)
        if code != EXIT_PASS:  # an error, or an exception on its way out (Ctrl-C)
            remove_empty_folders(made)


@finetune_app.command("export", cls=Command)
@exits
def finetune_export(
    source: Annotated[
        Path, typer.Argument(metavar="OUTPUT", help="fine-tune run folder, or an adapter folder")
    ],
    target: Annotated[Path, typer.Argument(metavar="DIR", help="new folder to write")],
    merge: Annotated[
        bool, typer.Option("--merge", help="merge the adapter into its base: one plain model folder")
    ] = False,
    dtype: Annotated[
        Literal["bfloat16", "float32"],
        typer.Option(metavar="bfloat16|float32", help="weight dtype of the merged model"),
    ] = "bfloat16",
    base: Annotated[
        str | None,
        typer.Option(metavar="DIR|NAME", help="base model (default: the adapter's base_model_name_or_path)"),
    ] = None,
) -> int:
    """A servable folder: the adapter with its tokenizer and tool chat template, or the merged model."""
    from gpuval.finetune.export.folder import export, find_adapter, log_folder
    from gpuval.quiet import route_third_party_output

    # transformers' loading bars and PEFT's warnings: to the log, whether the export succeeds or not
    route_third_party_output(log_folder(find_adapter(source).folder))
    adapter, base_model = export(source, target, merge=merge, dtype=dtype, base=base)
    what = f"adapter '{adapter}'"
    if merge:
        what = f"merged model ({dtype}) of adapter '{adapter}' on '{base_model}'"
    say(f"wrote {what} to {target}, with the tokenizer and its tool chat template")
    return EXIT_PASS
