"""A trained adapter, checked and written out for serving: `gpuval finetune export`.

- `adapter`: an adapter folder checked against what gpuval and PEFT write, before any model loads (also
  what `finetune eval` reads an adapter with);
- `folder`: the adapter copied, or merged into its base, as one folder that appears whole or not at all.

May import gpuval.finetune's base modules (config, model, template) and `checkpoint` (the final adapter's
name, the tokenizer it saves with); never the step, the parallel modes or the loop
(tests/test_structure.py).
"""
