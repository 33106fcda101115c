"""Mounted file systems from /proc/mounts, with shared (network or cluster) file systems flagged.

Training data, checkpoints and the cross-node file check all need a file system every node sees; a
node that mounts it as local ext4, or not at all, is a common bring-up mistake.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuval.discover.host import read_text

# Network and cluster file systems, by the type /proc/mounts names (FUSE ones as fuse.<subtype>).
SHARED_TYPES = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "cephfs",
    "fuse.ceph-fuse",
    "glusterfs",
    "fuse.glusterfs",
    "wekafs",
    "weka",
    "virtiofs",
    "9p",
    "cifs",
    "smb3",
    "smbfs",
    "panfs",
    "pvfs2",
    "orangefs",
    "ocfs2",
    "gfs2",
    "afs",
    "fuse.juicefs",
    "fuse.gcsfuse",
    "fuse.s3fs",
    "fuse.mount-s3",
    "fuse.blobfuse2",
    "fuse.sshfs",
    "fuse.daos",
    "fuse.dfuse",
}

# Kernel interfaces, not storage: dropped from the inventory altogether.
KERNEL_TYPES = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "nsfs",
    "efivarfs",
    "rpc_pipefs",
    "selinuxfs",
    "hugetlbfs",
    "autofs",
    "nfsd",
}

# In memory: kept in the inventory (/dev/shm's size matters to NCCL), left out of the table for people.
MEMORY_TYPES = {"tmpfs", "devtmpfs", "ramfs"}


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal: '\\040' -> ' '."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _size_bytes(options: str) -> int | None:
    """A tmpfs 'size=65536k' option -> bytes."""
    match = re.search(r"(?:^|,)size=(\d+)([kmg]?)(?:,|$)", options)
    if not match:
        return None
    return int(match.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2)]


def mounts(root: Path = Path("/")) -> list[dict[str, Any]]:
    """Every storage mount, the last one per mount point (a later mount hides an earlier one there)."""
    text = read_text(root / "proc/mounts") or ""
    by_point: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] in KERNEL_TYPES:
            continue
        device, point, fs_type, options = (_unescape(part) for part in parts[:4])
        entry: dict[str, Any] = {
            "device": device,
            "mount_point": point,
            "fs_type": fs_type,
            "shared": fs_type in SHARED_TYPES,
            "read_only": "ro" in options.split(","),
        }
        if fs_type in MEMORY_TYPES:
            entry["size_bytes"] = _size_bytes(options)
        by_point.pop(point, None)  # keep mount order, with the visible mount where it was mounted last
        by_point[point] = entry
    return list(by_point.values())


def shown_to_people(mount: dict[str, Any]) -> bool:
    """Shared file systems, local disks people put data on, and /dev/shm; not container plumbing
    (bind-mounted /etc/hosts and the like) nor other memory file systems."""
    point = mount["mount_point"]
    if mount["shared"] or point in ("/", "/dev/shm"):
        return True
    if mount["fs_type"] in MEMORY_TYPES or mount["fs_type"] == "squashfs":
        return False
    return not point.startswith(("/etc/", "/dev/", "/proc/", "/sys/", "/run/", "/boot/efi"))
