"""gpuval: bring-up validation for NVIDIA GPU nodes and clusters."""

__version__ = "0.1.0"
