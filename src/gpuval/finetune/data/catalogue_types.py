"""The row types of the catalogue's data table (catalogue_data.py): a value pool, a function's
argument, a function. Apart so that the table and the algorithms over it (catalogue.py) both import them
without importing each other."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Pool:
    """An ordered sequence of argument values: `size` of them, value `i` is `value(i)`."""

    size: int
    value: Callable[[int], Any]
    text: bool = False  # a listed pool of strings: "synthetic" values can be made in its shape


@dataclass(frozen=True)
class Param:
    """One argument. `phrase` is how a request mentions an optional argument ("{name}" is its value);
    a boolean is written in requests as `bool_text[value]`."""

    name: str
    type: Literal["string", "number", "integer", "boolean", "array"]
    description: str
    pool: str = ""
    enum: tuple[str, ...] = ()
    required: bool = True
    phrase: str = ""
    items: Literal["string", "number", ""] = ""
    bool_text: tuple[str, str] = ("", "")


@dataclass(frozen=True)
class FunctionSpec:
    """A function: its schema, how people ask for it, what it returns and how the assistant answers."""

    name: str
    description: str
    params: tuple[Param, ...]
    asks: tuple[str, ...]
    result: Callable[[dict[str, Any], random.Random], dict[str, Any]]
    answer: str

    def schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for param in self.params:
            prop: dict[str, Any] = {"type": param.type, "description": param.description}
            if param.enum:
                prop["enum"] = list(param.enum)
            if param.items:
                prop["items"] = {"type": param.items}
            properties[param.name] = prop
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": [p.name for p in self.params if p.required],
            },
        }
