"""What is here: the inventory of one node (GPUs, software versions, host)."""

from gpuval.discover.basic import node_inventory, local_gpu_names

__all__ = ["local_gpu_names", "node_inventory"]
