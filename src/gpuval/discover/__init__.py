"""What is here: the inventory of one node (GPUs, software versions, host)."""

from gpuval.discover.basic import local_gpu_names, node_inventory

__all__ = ["local_gpu_names", "node_inventory"]
