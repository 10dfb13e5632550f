"""A scikit-learn estimator as an ONNX graph, the ways skl2onnx can make one
(``candidates``), for ``serving.model.compiled`` to try in order.

Inputs are prepared as scikit-learn sees them: the graph takes float64 (as scikit-learn's
scalers and linear models compute), and a tree ensemble takes float32, as scikit-learn's
trees compare ``float32(x)`` with float64 thresholds: after a pipeline's head (in double)
through a ``Cast``, each threshold the largest float32 not above scikit-learn's and each
node's missing values sent the way scikit-learn sends them (``_exact_thresholds``). A
model fitted on a DataFrame with string columns takes one ``(batch, 1)`` input per column,
as skl2onnx exports DataFrame pipelines.

Boundary: standard library, numpy and ``serving`` core modules; skl2onnx and onnx are
imported when a model is converted.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.model.handle import ModelHandle
from serving.model.parity import trees_of

__all__ = ["Graph", "NotCompiled", "candidates", "first_line", "fitted_on_frame", "reason"]

#: skl2onnx opsets: ``ai.onnx.ml`` 3 keeps tree thresholds in double for double inputs.
_OPSETS = {"": 17, "ai.onnx.ml": 3}


#: scikit-learn tree models: skl2onnx converts them for float32 input (ONNX Runtime runs
#: no double tree ensembles), as scikit-learn's trees compare ``float32(x)``.
_TREES = re.compile(r"(DecisionTree|ExtraTree|RandomForest|ExtraTrees|GradientBoosting)"
                    r"(Classifier|Regressor)$|^IsolationForest$")  # fmt: skip


class NotCompiled(Exception):
    """Why a model is served by its own library: the reason, one line."""


@dataclass(frozen=True)
class Graph:
    data: Any  # onnx.ModelProto
    #: The scikit-learn steps that run before the graph (a pipeline's head), or None.
    head: Any
    #: Whether the graph takes one ``(batch, 1)`` input per feature column.
    per_column: bool
    #: Whether its numeric input is float32 (a tree model fed directly), else double.
    narrow: bool
    #: Per feature, the pandas categories whose codes the graph takes (XGBoost, LightGBM:
    #: a value's position, NaN when missing or not among them), else None.
    codes: tuple[tuple[Any, ...] | None, ...] | None = None
    #: Labels from the probabilities' argmax (fetching the ``probabilities`` output only),
    #: not from the graph's ``label`` output.
    argmax: bool = False


def candidates(estimator: Any, handle: ModelHandle) -> list[tuple[str, Callable[[], Graph]]]:
    """The ways to compile ``estimator``, best first: the whole model in double (a tree
    ensemble in float32, as scikit-learn's trees compare, after a pipeline's head in
    double); the whole model in float32; its final step alone, after the steps before it
    run in scikit-learn."""
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType

    steps = getattr(estimator, "steps", None)
    head, final = (estimator[:-1], steps[-1][1]) if steps and len(steps) > 1 else (None, estimator)
    trees = bool(_TREES.search(type(final).__name__))
    per_column = any(f.dtype.kind == "O" for f in handle.features or ())
    width = getattr(final, "n_features_in_", None)

    def whole() -> Graph:
        if not trees:
            types = _input_types(handle, per_column)
            return Graph(_to_onnx(estimator, types), None, per_column, False)
        if head is None:
            types = _input_types(handle, per_column, FloatTensorType)
            return Graph(_exact_thresholds(_to_onnx(final, types), final), None, per_column, True)
        tail = _to_onnx(final, [("X", FloatTensorType([None, int(width or 0)]))])
        tail = _exact_thresholds(tail, final)
        joined = _joined(_to_onnx(head, _input_types(handle, per_column)), tail)
        return Graph(joined, None, per_column, False)

    def narrow() -> Graph:
        types = _input_types(handle, per_column, FloatTensorType)
        return Graph(_to_onnx(estimator, types), None, per_column, True)

    def last(numbers: Any) -> Callable[[], Graph]:
        def build() -> Graph:
            graph = _to_onnx(final, [("X", numbers([None, int(width or 0)]))])
            if trees:
                graph = _exact_thresholds(graph, final)
            return Graph(graph, head, False, numbers is FloatTensorType)

        return build

    # trees after a head ONNX Runtime computes exactly as scikit-learn (elementwise steps);
    # after another (a PCA's sums in another order), a value a last bit apart can round
    # to another float32 beside a threshold: scikit-learn computes that head
    found = [("as a whole", whole)] if not trees or head is None or _exact(head) else []
    if not trees:
        found.append(("as a whole in float32", narrow))
    if steps and head is not None and width is not None:
        name = steps[-1][0]
        found.append((f"its final step {name!r} after scikit-learn's steps before it",
                      last(FloatTensorType if trees else DoubleTensorType)))  # fmt: skip
        if not trees:
            found.append((f"its final step {name!r} in float32 after scikit-learn's steps",
                          last(FloatTensorType)))  # fmt: skip
    return found


#: Steps whose output ONNX Runtime computes bit for bit as scikit-learn does: elementwise
#: arithmetic, lookups and copies.
_EXACT_STEPS = frozenset({
    "StandardScaler", "MinMaxScaler", "MaxAbsScaler", "RobustScaler", "OneHotEncoder",
    "OrdinalEncoder", "SimpleImputer", "ColumnTransformer", "Pipeline",
})  # fmt: skip


def _exact(step: Any) -> bool:
    """Whether ``step`` (a pipeline's head) is made of ``_EXACT_STEPS`` only."""
    if isinstance(step, str):  # a ColumnTransformer's "passthrough" or "drop"
        return step in ("passthrough", "drop")
    if type(step).__name__ not in _EXACT_STEPS:
        return False
    parts = getattr(step, "steps", None) or getattr(step, "transformers_", None) or ()
    return all(_exact(part[1]) for part in parts)


def _to_onnx(estimator: Any, initial_types: list[tuple[str, Any]]) -> Any:
    """``estimator`` converted by skl2onnx (probabilities as a tensor, no ZipMap)."""
    from skl2onnx import convert_sklearn

    options = {id(estimator): {"zipmap": False}} if hasattr(estimator, "classes_") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converter deprecations are not the user's
        return convert_sklearn(
            estimator, initial_types=initial_types, options=options, target_opset=_OPSETS
        )


def _exact_thresholds(model: Any, estimator: Any) -> Any:
    """``model`` (skl2onnx's float32 graph of ``estimator``'s trees) with each threshold
    ``t`` the largest float32 not above scikit-learn's float64 one: for a float32 ``x``,
    ``x <= t32`` exactly when ``x <= t``, as scikit-learn compares (skl2onnx rounds ``t``
    to the nearest float32, which sends a value equal to it the other way when it rounds
    up); and a missing value sent to the child scikit-learn sends it to
    (``missing_go_to_left``; skl2onnx sends it right always). Trees and nodes are matched
    by skl2onnx's ids (the estimator's trees in order, each node by its index) and checked
    by feature; a graph that does not match is left as it is (the parity rows decide)."""
    from onnx import helper

    trees = trees_of(estimator)
    for node in model.graph.node:
        if not node.op_type.startswith("TreeEnsemble"):
            continue
        attrs = {a.name: a for a in node.attribute}
        if "nodes_values" not in attrs or "nodes_missing_value_tracks_true" not in attrs:
            return model
        ids = list(attrs["nodes_treeids"].ints)
        nodes = list(attrs["nodes_nodeids"].ints)
        features = list(attrs["nodes_featureids"].ints)
        modes = [m.decode() for m in attrs["nodes_modes"].strings]
        values = list(attrs["nodes_values"].floats)
        tracks = list(attrs["nodes_missing_value_tracks_true"].ints)
        for k, mode in enumerate(modes):
            if mode == "LEAF":
                continue
            if mode != "BRANCH_LEQ" or ids[k] >= len(trees):
                return model
            tree = trees[ids[k]]
            if nodes[k] >= tree.node_count or tree.feature[nodes[k]] != features[k]:
                return model
            values[k] = float(_float32_at_most(float(tree.threshold[nodes[k]])))
            left = getattr(tree, "missing_go_to_left", None)  # scikit-learn 1.3+
            tracks[k] = int(left[nodes[k]]) if left is not None else 0
        for name, new in (("nodes_values", values), ("nodes_missing_value_tracks_true", tracks)):
            node.attribute.remove(attrs[name])
            node.attribute.append(helper.make_attribute(name, new))
    return model


def _float32_at_most(value: float) -> np.float32:
    """The largest float32 not above ``value``."""
    narrow = np.float32(value)
    return narrow if float(narrow) <= value else np.nextafter(narrow, np.float32(-np.inf))


def _joined(head: Any, tail: Any) -> Any:
    """One graph: ``head``'s output cast to float32 into ``tail``'s input."""
    from onnx import TensorProto, compose, helper

    out = head.graph.output[0].name
    head.graph.node.append(helper.make_node("Cast", [out], ["__as_float32"], to=TensorProto.FLOAT))
    del head.graph.output[:]
    head.graph.output.append(
        helper.make_tensor_value_info("__as_float32", TensorProto.FLOAT, [None, None])
    )
    tail = compose.add_prefix(tail, "tail_")
    versions: dict[str, int] = {}
    for model in (head, tail):
        for opset in model.opset_import:
            versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    for model in (head, tail):
        del model.opset_import[:]
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in versions.items())
    return compose.merge_models(head, tail, io_map=[("__as_float32", tail.graph.input[0].name)])


def _input_types(
    handle: ModelHandle, per_column: bool, numbers: Any = None
) -> list[tuple[str, Any]]:
    """One ``(batch, n_features)`` input of ``numbers`` (default double), or one
    ``(batch, 1)`` input per feature column (strings as strings)."""
    from skl2onnx.common.data_types import DoubleTensorType, StringTensorType

    numbers = numbers or DoubleTensorType
    features = handle.features or ()
    if not per_column:
        return [("X", numbers([None, len(features)]))]
    if handle.feature_names is None or not fitted_on_frame(handle.estimator):
        raise NotCompiled("it takes strings in an array, not in a DataFrame")
    return [
        (f.name, StringTensorType([None, 1]) if f.dtype.kind == "O" else numbers([None, 1]))
        for f in features
    ]


def fitted_on_frame(estimator: Any) -> bool:
    return getattr(estimator, "feature_names_in_", None) is not None


def reason(error: Exception, estimator: Any) -> str:
    """Why a way failed, one line: the pipeline step skl2onnx could not convert, by name,
    where its error names the step's type."""
    if isinstance(error, NotCompiled):
        return str(error)
    message = str(error)
    for name, step in getattr(estimator, "steps", None) or ():
        if f"{type(step).__module__}.{type(step).__name__}" in message or (
            "shape calculator" in message and type(step).__name__ in message
        ):
            return f"skl2onnx cannot convert step {name!r} ({type(step).__name__})"
    return f"{type(error).__name__}: {first_line(error)}"


#: Where onnx's "Unable to create node 'X'" goes on to quote the node's attributes (every
#: leaf's value of a tree ensemble): cut there.
_QUOTING = " with name="


def first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__).split(_QUOTING)[0][:300]
