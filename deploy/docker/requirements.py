"""Print gpuval's runtime requirements for the image, read from pyproject.toml: the core dependencies and
the `finetune`, `gpu` and `fa4` extras (the image is for GPU nodes: FlashAttention-4 is the attention
of whole-document rows on Hopper when installed), without torch (the base image's CUDA build of PyTorch
stays; installing gpuval's own `torch` requirement could replace it with a CPU or other CUDA wheel).

    python deploy/docker/requirements.py > /tmp/requirements.txt && pip install -r /tmp/requirements.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

EXTRAS = ("finetune", "gpu", "fa4")


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    found = list(project["dependencies"])
    for extra in EXTRAS:
        found += project["optional-dependencies"][extra]
    return [req for req in found if re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower() != "torch"]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    print("\n".join(requirements(root / "pyproject.toml")))
