"""How well a tuned model calls functions: the evaluation of `gpuval finetune eval`.

- `scoring`: a generated reply against the reference calls (exact, AST as BFCL scores, per-split metrics);
- `evaluate`: generation over a split in batches, tuned and base, and the scores;
- `inputs`: the eval splits and the adapter's base read and checked before a model loads.

May import gpuval.finetune's base modules (config, model, template) and its data readers (data,
openai_format); never the step, the parallel modes or the loop (tests/test_structure.py).
"""
