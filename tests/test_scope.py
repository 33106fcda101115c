"""gpuval.scope: the stored scope strings, built and read back by one type."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuval.errors import UsageError
from gpuval.scope import Scope, ScopeError, node_of, place_of, read

# Every shape as gpuval has written it into result.json, JUnit, HTML and history files.
WRITTEN = [
    ("cluster", Scope.cluster()),
    ("node:n1", Scope.of_node("n1")),
    ("gpu:node-1.example/3", Scope.gpu("node-1.example", 3)),
    ("cpu:host/0", Scope.cpu("host", 0)),
    ("link:n1/gpu0-gpu1", Scope.link("n1", "gpu0", "gpu1")),
    ("link:n1/gpu0-nvlink5", Scope.link("n1", "gpu0", "nvlink5")),
    ("link:n1/mlx5_0-port1", Scope.link("n1", "mlx5_0", "port1")),
    ("pair:node-a+node-b", Scope.pair("node-a", "node-b")),
]


@pytest.mark.parametrize(("text", "scope"), WRITTEN)
def test_parse_and_render_are_each_others_inverse_on_every_written_shape(text, scope):
    assert str(scope) == scope.render() == text
    assert Scope.parse(text) == scope


def test_accessors():
    gpu = Scope.parse("gpu:n1/3")
    assert (gpu.kind, gpu.node, gpu.gpu_index, gpu.place, gpu.owner) == ("gpu", "n1", 3, "n1/3", "n1")
    link = Scope.parse("link:n1/mlx5_bond-0-port1")  # a '-' in the first end: the last '-' splits
    assert (link.node, link.ends, link.gpu_index) == ("n1", ("mlx5_bond-0", "port1"), None)
    pair = Scope.parse("pair:a+b")
    assert (pair.node, pair.other, pair.nodes, pair.owner) == ("a", "b", ("a", "b"), "a+b")
    assert Scope.cpu("h", 1).gpu_index is None and Scope.cpu("h", 1).index == 1
    assert (Scope.cluster().node, Scope.cluster().nodes, Scope.cluster().owner) == (None, (), None)


@pytest.mark.parametrize(
    "text",
    ["", "world", "gpu:n1", "gpu:n1/x", "gpu:/0", "gpu:n1/-1", "node:", "node:a/b", "link:n1/gpu0",
     "link:n1/-b", "pair:a", "pair:a+", "disk:n1", "gpu:n 1/0", "cluster:x", "Cluster"],
)  # fmt: skip
def test_a_malformed_scope_is_one_line_naming_it_and_the_shapes(text):
    with pytest.raises(ScopeError) as caught:
        Scope.parse(text)
    message = str(caught.value)
    assert "\n" not in message and repr(text) in message and "gpu:NODE/INDEX" in message
    assert isinstance(caught.value, UsageError)  # the CLI prints it as one line and exits 2
    assert read(text) is None


@pytest.mark.parametrize(
    "build",
    [lambda: Scope.of_node("a/b"), lambda: Scope.gpu("n1", -1), lambda: Scope.link("n", "a", "b-c"),
     lambda: Scope.pair("a+b", "c"), lambda: Scope.of_node("")],
)  # fmt: skip
def test_a_scope_that_would_not_read_back_cannot_be_built(build):
    with pytest.raises(ScopeError, match="would not read back"):
        build()


def test_lenient_readers_keep_what_the_split_gave():
    """node_of and place_of read files that may hold text of another shape: they never raise."""
    assert [node_of(s) for s in ("gpu:n1/3", "node:n2", "link:n3/gpu0-nvlink5", "cpu:n4/0", "cluster")] == [
        "n1", "n2", "n3", "n4", None,
    ]  # fmt: skip
    assert node_of("pair:a+b") == "a+b" and node_of("world") is None
    assert [place_of(s) for s in ("gpu:node1/3", "cluster", "world", "link:n/0-1")] == [
        "node1/3", "cluster", "world", "n/0-1",
    ]  # fmt: skip


_NAMES = st.text(
    st.characters(blacklist_categories=("Cs", "Z", "Cc"), blacklist_characters=":/+"), min_size=1
)
_END = st.text(st.characters(blacklist_categories=("Cs", "Z", "Cc"), blacklist_characters="/"), min_size=1)
_SCOPES = st.one_of(
    st.just(Scope.cluster()),
    st.builds(Scope.of_node, _NAMES),
    st.builds(Scope.gpu, _NAMES, st.integers(0, 10**6)),
    st.builds(Scope.cpu, _NAMES, st.integers(0, 10**6)),
    st.builds(Scope.link, _NAMES, _END, _END.filter(lambda end: "-" not in end)),
    st.builds(Scope.pair, _NAMES, _NAMES),
)


@given(_SCOPES)
def test_any_buildable_scope_reads_back_as_itself(scope):
    assert Scope.parse(str(scope)) == scope
    assert node_of(str(scope)) == scope.owner
