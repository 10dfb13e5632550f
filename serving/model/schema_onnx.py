"""What an ONNX graph tells about its inputs beyond their types: the categories of a
string or integer input that feeds a ``OneHotEncoder`` node (refused when unknown, as the
node's ``zeros=0`` does), and whether a float input may be missing (it feeds an
``Imputer`` node). skl2onnx exports of scikit-learn pipelines carry both.

An input's path to such a node is followed through the nodes that only move values
(``Gather``, ``Reshape``, ``Cast``, ``Concat``, ...). The graph is read with the ``onnx``
package; a graph it cannot read tells nothing (types only).

Boundary: standard library; ``onnx`` is imported when a graph is read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GraphFacts", "InputFacts", "graph_facts"]

log = logging.getLogger(__name__)

#: Nodes whose outputs hold their data inputs' values, moved or cast.
_MOVES = {"Identity", "Cast", "Gather", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Concat"}


@dataclass(frozen=True)
class InputFacts:
    """What the graph says of one input: its known categories when an unknown one fails
    the graph (None: any value is answered), and whether NaN is imputed."""

    categories: frozenset[Any] | None = None
    missing: bool = False


def _sources(name: str, producers: dict[str, Any], inputs: set[str]) -> Iterator[str]:
    """The graph inputs whose values reach ``name`` through value-moving nodes only."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in inputs:
            yield current
            continue
        node = producers.get(current)
        if node is None or node.op_type not in _MOVES:
            continue
        stack.extend(node.input if node.op_type == "Concat" else node.input[:1])


@dataclass(frozen=True)
class GraphFacts:
    """``inputs``: per graph input name, what its encoder and imputer nodes say (inputs
    that feed neither are absent). ``classes``: the class labels of the graph's
    classifier node (``classlabels_ints``/``classlabels_strings`` of skl2onnx's
    ``LinearClassifier``, ``TreeEnsembleClassifier``, ``SVMClassifier``), in the column
    order of its probabilities; None when it has none."""

    inputs: dict[str, InputFacts]
    classes: tuple[Any, ...] | None


_LABELS = ("classlabels_ints", "classlabels_int64s", "classlabels_strings")


def graph_facts(path: Path) -> GraphFacts:
    """What the graph at ``path`` says of its inputs and classes (nothing when the
    ``onnx`` package cannot read it)."""
    try:
        import onnx
        from onnx import helper

        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # no onnx package, or a graph it cannot parse: types only
        log.info("reading %s's encoders with onnx failed: %s", path, exc)
        return GraphFacts({}, None)
    graph = model.graph
    inputs = {value.name for value in graph.input}
    producers = {output: node for node in graph.node for output in node.output}
    facts: dict[str, InputFacts] = {}
    classes: tuple[Any, ...] | None = None
    for node in graph.node:
        if node.domain == "ai.onnx.ml" and node.op_type.endswith("Classifier"):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            labels = next((attrs[key] for key in _LABELS if attrs.get(key)), None)
            if labels is not None:
                classes = tuple(v.decode() if isinstance(v, bytes) else int(v) for v in labels)
        if node.op_type == "OneHotEncoder" and node.domain == "ai.onnx.ml":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            values = attrs.get("cats_strings") or attrs.get("cats_int64s") or []
            known = frozenset(v.decode() if isinstance(v, bytes) else int(v) for v in values)
            strict = attrs.get("zeros", 1) == 0
            for source in _sources(node.input[0], producers, inputs):
                facts[source] = InputFacts(known if strict else None, missing=not strict)
        elif node.op_type == "Imputer" and node.domain == "ai.onnx.ml":
            for source in _sources(node.input[0], producers, inputs):
                old = facts.get(source, InputFacts())
                facts[source] = InputFacts(old.categories, missing=True)
    return GraphFacts(facts, classes)
