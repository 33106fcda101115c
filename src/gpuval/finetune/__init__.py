"""`gpuval finetune`: Qwen2 + LoRA on Glaive function-calling data, on 1 to 16 GPUs or a CPU.

The house, bottom up (imports go one way: tests/test_structure.py holds each subpackage to it):

- the base, used by all: `config` (the fine-tune config), `model` (models, tokenizers, LoRA), `template`
  (the Qwen tool chat template), `optim`, `flops`, `lock`, and `parts`, the one contract of everything that
  changes the step (Part, Decision, StepContext);
- `data/`: Glaive and OpenAI records, prepare, the synthetic records, packing, the step's batches;
- `parallel/`: one process, DDP, FSDP2 and ZeRO, and the sharding switches (parts);
- `step/`: the step's kernels, fusions, checkpointing and compiling (parts), every part in one declared
  order (`step.build.PARTS`), and the step built from them;
- `eval/`: scoring and evaluation; `export/`: the adapter checked and written out;
- the loop at the top: `trainer` (train), `checkpoint` and `pending` (what the loop saves and logs), and
  `pipeline` (synth → prepare → train → eval for `finetune run`).
"""
