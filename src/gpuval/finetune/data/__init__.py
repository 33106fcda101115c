"""The fine-tune's data: Glaive and OpenAI records in, prepared splits out, packed rows for the step.

- `glaive`, `openai_format`: the two input formats read into conversations;
- `prepare`: JSONL read as JSON Lines specifies, records converted and checked, the splits written
  (`finetune prepare`);
- `synth` with `catalogue`, `catalogue_types` and `catalogue_data` (its table of functions, a data table):
  synthetic Glaive-format records for a machine without the dataset;
- `packing`: conversations packed first-fit into rows of max_seq_len tokens; `batches`: each step's
  micro-batches of those rows for one rank.

May import gpuval.finetune's base modules (config, model, template); never evaluation, export, the step,
the parallel modes or the loop (tests/test_structure.py).
"""
