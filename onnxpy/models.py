"""Models onnxpy builds itself: the CLI's default model (a small image classifier with fixed weights)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def default_model() -> onnx.ModelProto:
    """A small CNN: Conv-BatchNorm-Relu-MaxPool-Conv-Relu-GlobalAveragePool-Flatten-Gemm-Softmax.

    Input ``image`` float32 [N, 3, 32, 32]; output ``probabilities`` float32 [N, 10].  Weights come from a fixed
    seed so every run prints the same numbers.
    """
    rng = np.random.default_rng(0)

    def init(name, *shape, scale=0.1):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("conv1_w", 16, 3, 3, 3), init("conv1_b", 16),
        numpy_helper.from_array(np.ones(16, np.float32), "bn_scale"), init("bn_bias", 16),
        init("bn_mean", 16), numpy_helper.from_array(np.full(16, 0.9, np.float32), "bn_var"),
        init("conv2_w", 32, 16, 3, 3), init("conv2_b", 32),
        init("fc_w", 10, 32), init("fc_b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1_w", "conv1_b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "onnxpy_default_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpy")
    model.ir_version = 8
    return model


def default_input(batch: int = 1) -> dict:
    rng = np.random.default_rng(1)
    return {"image": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
