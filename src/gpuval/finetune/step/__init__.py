"""The training step: the model as the loop runs it, and every optional change of it (issue 35's parts).

- `build`: every part in its one declared order (PARTS: these, and the sharding switches of
  finetune/parallel/sharding.py), their decisions and the model built from them; the contract they all
  follow is finetune/parts.py (Part, Decision, StepContext, RowLayout, WeightPlan);
- one module per part and its kernels: `attention` (with `flash4`), `liger_ops`, `packed_dropout`,
  `fused_qkv`, `fused_mlp`, `fp8`, `loss_head` (with `linear_ce`), `split_products`, `last_mlp_rows`,
  `compiled` (torch.compile per decoder layer), `memory` (activation checkpointing, from the step's
  estimated memory).

May import gpuval.finetune's base modules (config, model, optim, template, parts) and the parallel modes
and switches (the step is built inside one); never the data, evaluation, export or the loop
(tests/test_structure.py).
docs/step-parts.md says how to add a part.
"""
