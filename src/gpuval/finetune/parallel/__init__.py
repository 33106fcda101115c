"""How the fine-tune runs on several ranks: `train.parallel` and `train.sharding`.

- `modes`: one process, DDP, FSDP2 (`fully_shard`) and DeepSpeed ZeRO, each a wrapper with the same
  forward, backward, step and checkpoint calls (make_parallel);
- `sharding`: the sharding switches, each a step part (finetune/parts.py's contract, listed in step.PARTS):
  how the frozen base's weights are held and moved;
- `zero3_step`: the ZeRO-3 step's own changes (the lean step, the fused gradient epilogue).

May import gpuval.finetune's base modules (config, model, optim, template, parts: the contract); never the
data, the step's parts, evaluation, export or the loop (tests/test_structure.py).
"""
