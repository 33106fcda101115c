"""What is here: the inventory of one node (host, software, GPUs, topology, network, storage, scheduler)."""

from gpuval.discover.gpus import local_gpu_names
from gpuval.discover.inventory import node_inventory

__all__ = ["local_gpu_names", "node_inventory"]
