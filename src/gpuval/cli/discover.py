"""`gpuval discover`: the inventory of this node, as tables, JSON or a block for a bug report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpuval.cli.options import console, exits, output_file, say
from gpuval.errors import EXIT_PASS, UsageError


@exits
def discover(
    json_: Annotated[bool, typer.Option("--json", help="print the inventory as JSON")] = False,
    output: Annotated[Path | None, output_file("the inventory as JSON")] = None,
    paste: Annotated[
        bool, typer.Option("--paste", help="a short plain-text block to paste into a bug report")
    ] = False,
) -> int:
    """What is here: host, software, GPUs, topology, InfiniBand, storage, scheduler (one process)."""
    from gpuval.atomic import ensure_writable_dir, write_text_atomic
    from gpuval.discover import node_inventory
    from gpuval.report.inventory import paste_block, print_inventory

    if output is not None:
        if output.is_dir():
            raise UsageError(f"--output '{output}' is a directory; give a file name, e.g. {output}/node.json")
        ensure_writable_dir(output.parent)
    inventory = node_inventory()
    text = json.dumps(inventory, indent=2) + "\n"
    if output is not None:
        write_text_atomic(output, text)
    if json_:
        sys.stdout.write(text)
    elif paste:
        sys.stdout.write(paste_block(inventory))
    else:
        print_inventory(inventory, console)
    if output is not None and not json_:
        say(f"wrote {output}", err=True)
    return EXIT_PASS
