"""`gpuval discover` says which NCCL transport the node's GPUs would use (issue 51, point 4): inside the node
from the recorded NVLink topology, between nodes from the RDMA ports in sysfs and NCCL's variables."""

from __future__ import annotations

from pathlib import Path

from nvml_replay import ReplayNvml, load

from gpuval.discover import node_inventory
from gpuval.discover.network import infiniband_ports
from gpuval.discover.transport import between_nodes, inside_node

FAKE_ROOT = Path(__file__).parent / "data" / "sysfs"  # mlx5_0:1 ACTIVE (InfiniBand), mlx5_1:1 DOWN


def _ports():
    return infiniband_ports(FAKE_ROOT)


def test_an_active_ib_port_that_nccl_ib_hca_admits_is_used_between_nodes():
    assert between_nodes({}, _ports()) == "InfiniBand verbs on 1 active port(s): mlx5_0:1"
    for spec in ("mlx5", "=mlx5_0", "mlx5_0:1", "^mlx5_1", "=mlx5_0:1,mlx5_1"):
        assert between_nodes({"NCCL_IB_HCA": spec}, _ports()).startswith("InfiniBand verbs"), spec
    roce = [{**_ports()[0], "link_layer": "Ethernet"}]
    assert between_nodes({}, roce) == "RoCE verbs on 1 active port(s): mlx5_0:1"


def test_sockets_when_ib_is_off_excluded_down_or_absent_saying_why():
    picks = "the interfaces NCCL picks (ib* first, then any but lo and docker*)"
    assert between_nodes({"NCCL_IB_DISABLE": "1"}, _ports()) == f"TCP sockets on {picks} (NCCL_IB_DISABLE=1)"
    said = between_nodes({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "eth0"}, _ports())
    assert said == "TCP sockets on NCCL_SOCKET_IFNAME=eth0 (NCCL_NET=Socket)"
    for spec in ("^mlx5_0", "=mlx5", "mlx5_0:2", "mlx5_1"):  # each admits no active port
        said = between_nodes({"NCCL_IB_HCA": spec}, _ports())
        assert said.endswith(f"NCCL_IB_HCA={spec} admits none of the 1 active RDMA port(s)"), said
    assert between_nodes({}, _ports()[1:]).endswith(": no RDMA port is active")
    assert between_nodes({"NCCL_NET": "IB"}, []).endswith(
        "no RDMA device (no /sys/class/infiniband) (NCCL_NET=IB would fail)"
    )
    assert between_nodes({"NCCL_NET_PLUGIN": "aws-ofi"}, _ports()).startswith("cannot tell")


def test_inside_the_node_nvlink_unless_p2p_or_shared_memory_is_turned_off():
    nvlink = {"gpus": [0, 1], "matrix": [["X", "NV18"], ["NV18", "X"]]}
    assert inside_node({}, nvlink) == "NVLink peer to peer (every pair of GPUs joined by NVLink)"
    assert (
        inside_node({"NCCL_P2P_DISABLE": "1"}, nvlink)
        == "shared memory through the host (NCCL_P2P_DISABLE=1)"
    )
    both = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}  # one host as two nodes (issue 51)
    assert inside_node(both, nvlink).startswith("the network transport, as between nodes")
    pcie = {"gpus": [0, 1, 2], "matrix": [["X", "PIX", "SYS"], ["PIX", "X", "SYS"], ["SYS", "SYS", "X"]]}
    assert inside_node({}, pcie).startswith("NCCL decides pair by pair (paths PIX, SYS;")
    assert inside_node({}, {"gpus": [0], "matrix": [["X"]]}) == "none: 1 GPU"


def test_the_inventory_of_a_recorded_h200_node_says_nvlink_inside_and_ib_between():
    inventory = node_inventory("h200-vm", ReplayNvml(load("h200x4")), FAKE_ROOT, environ={})
    assert inventory["nccl_transport"] == {
        "inside_node": "NVLink peer to peer (every pair of GPUs joined by NVLink)",
        "between_nodes": "InfiniBand verbs on 1 active port(s): mlx5_0:1",
    }
