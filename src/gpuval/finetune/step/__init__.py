"""The training step: the model as the loop runs it, and every optional change of it (issue 35's parts).

- `parts`: the contract every change of the step follows (Part, Decision, StepContext, RowLayout);
- `build`: the parts in their one declared order (PARTS), their decisions and the model built from them;
- one module per part and its kernels: `attention` (with `flash4`), `liger_ops`, `packed_dropout`,
  `fused_qkv`, `fused_mlp`, `fp8`, `loss_head` (with `linear_ce`), `split_products`, `last_mlp_rows`;
- `memory`: the activation-checkpointing choice from the step's estimated memory.

May import gpuval.finetune's base modules (config, model, optim, template) and the parallel modes (the
step is built inside one); never the data, evaluation, export or the loop (tests/test_structure.py).
docs/step-parts.md says how to add a part.
"""
