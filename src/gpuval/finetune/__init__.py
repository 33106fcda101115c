"""Fine-tuning for function calling: synthetic Glaive data, Glaive → messages, splits (more to come)."""
