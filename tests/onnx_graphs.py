"""Tiny ONNX graphs built with ``onnx.helper`` for loader tests (each a real, runnable file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Weights of ``multi_input_graph``: y = [a, b0, b1, n] @ WEIGHTS.
WEIGHTS = np.array([[1.0], [10.0], [100.0], [1000.0]], dtype=np.float32)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def multi_input_graph(path: Path) -> Path:
    """Inputs ``a`` float (batch, 1), ``b`` double (batch, 2), ``n`` int64 (batch,);
    outputs ``y`` = their columns times ``WEIGHTS`` (batch, 1) and ``features`` (batch, 4)."""
    nodes = [
        helper.make_node("Cast", ["b"], ["b32"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["n", "axis1"], ["n2"]),
        helper.make_node("Cast", ["n2"], ["n32"], to=TensorProto.FLOAT),
        helper.make_node("Concat", ["a", "b32", "n32"], ["features"], axis=1),
        helper.make_node("MatMul", ["features", "W"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "multi_input",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("b", TensorProto.DOUBLE, ["batch", 2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4]),
        ],
        initializer=[
            numpy_helper.from_array(WEIGHTS, "W"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        ],
    )
    return _save(graph, path)


def scale_graph(path: Path, batch: int | str, n_features: int | str = 3) -> Path:
    """``y = 2 * x`` for ``x`` float (batch, n_features): ``batch`` fixed when an int."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, n_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n_features])],
        initializer=[numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    return _save(graph, path)


def image_graph(path: Path) -> Path:
    """An input of rank 4 (batch, 3, 8, 8), which the service cannot take as instances."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 8])],
    )
    return _save(graph, path)


def int_identity_graph(path: Path) -> Path:
    """``y = x`` for ``x`` int64 (batch, 1): answers each instance's integer back, exactly."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "int_identity",
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", 1])],
    )
    return _save(graph, path)
