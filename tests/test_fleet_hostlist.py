"""Slurm hostlists both ways (gpuval.fleet.hostlist), against cases written by hand from Slurm's syntax
("HOSTLIST EXPRESSIONS" in Slurm's man pages; `scontrol show hostnames` / `show hostlist`)."""

from __future__ import annotations

import random

import pytest

from gpuval.fleet.hostlist import HostlistError, compress, parse


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("node[001-003,007]", ["node001", "node002", "node003", "node007"]),
        ("node[8-10]", ["node8", "node9", "node10"]),  # a range's width is its low end's: no padding
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("gpu-a7", ["gpu-a7"]),
        ("login", ["login"]),  # no digits at all
        ("a[1-2],b[01-02],c", ["a1", "a2", "b01", "b02", "c"]),  # several prefixes
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),  # every combination
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),  # a suffix after the bracket
        (" node[1,1,2] ", ["node1", "node2"]),  # blanks around, a name twice: once
        ("[1-3]", ["1", "2", "3"]),
    ],
)
def test_parse_hand_cases(expression, names):
    assert parse(expression) == names


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        (["node017", "node023", "node024", "node025"], "node[017,023-025]"),  # the example
        (["node003", "node001", "node002", "node007"], "node[001-003,007]"),  # order does not matter
        (["node9", "node10", "node11"], "node[9-11]"),  # unpadded numbers run across a digit
        (["node098", "node099", "node100"], "node[098-100]"),  # 100 has the padded width: one run
        (["node007"], "node007"),  # one name of a prefix: no bracket, as Slurm writes it
        (["b2", "a1", "a2", "login", "b1"], "a[1-2],b[1-2],login"),
        (["n01", "n1"], "n[1,01]"),  # two widths of one number: both kept
        ([], ""),
    ],
)
def test_compress_hand_cases(names, expression):
    assert compress(names) == expression
    assert sorted(parse(expression)) == sorted(set(names)) if names else True


def test_compress_then_parse_gives_the_names_back_for_random_sets():
    rng = random.Random(49)
    for _ in range(300):
        names = set()
        for _ in range(rng.randint(1, 40)):
            prefix = rng.choice(["node", "gpu-a", "r1n", "x", ""])
            number = rng.randint(0, 1200)
            width = rng.choice([0, 3, 4])
            names.add(f"{prefix}{number:0{width}d}" if prefix or number else f"{prefix}{number}")
        names.add(rng.choice(["login", "head-node"]))
        expression = compress(names)
        assert set(parse(expression)) == names, expression
        assert len(parse(expression)) == len(names)


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("node[1-3", "never closed"),
        ("node1-3]", "no '[' before it"),
        ("node[3-1]", "runs backwards"),
        ("node[a-b]", "not a number or a range"),
        ("node[1-2],,node3", "empty name between commas"),
        ("node[[1-2]]", "inside a bracket"),
        ("node[1-1000000]", "more than 100000 nodes"),
        ("r[1-1000]-n[1-1000]", "more than 100000 nodes"),
        ("", "empty hostlist"),
        ("node 1", "holds a blank"),
    ],
)
def test_bad_expressions_are_one_line_errors(expression, said):
    with pytest.raises(HostlistError) as raised:
        parse(expression)
    assert said in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_name_a_hostlist_cannot_hold_is_refused_when_compressed():
    with pytest.raises(ValueError, match="holds a blank"):
        compress(["node[1]"])
