"""The result files a command is given: files as named, folders searched for result.json at any depth.

A Slurm array or a Kubernetes Indexed Job leaves one folder per node, each with the result.json its
`gpuval accept --output DIR` wrote; naming the parent folder names them all. Used by `gpuval profiles
derive`, and by any command that reads many runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from gpuval.errors import UsageError

RESULT_NAME = "result.json"  # what gpuval accept and gpuval health write into their --output folder


def find_result_files(paths: Iterable[Path], name: str = RESULT_NAME) -> list[Path]:
    """Every file to read, in order: a file as given (any name: `gpuval bench --output` documents too),
    a folder's `name` files found below it (sorted, symbolic links to folders not followed). A file
    reached twice counts once. A path that is neither, or a folder holding none: a one-line UsageError."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(
                Path(folder) / name
                for folder, _, files in os.walk(path)
                if name in files and (Path(folder) / name).is_file()
            )
            if not inside:
                raise UsageError(
                    f"{path}: no {name} in this folder or below: pass result files, or the folders that "
                    "gpuval accept --output wrote"
                )
            found += inside
        elif path.is_file():
            found.append(path)
        else:
            what = "not a file or folder" if path.exists() else "no such file or folder"
            raise UsageError(f"{path}: {what}: pass result.json files or the folders holding them")
    seen: set[Path] = set()
    unique = []
    for path in found:
        if (key := path.resolve()) not in seen:
            seen.add(key)
            unique.append(path)
    return unique
