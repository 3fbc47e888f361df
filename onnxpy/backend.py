"""``onnx.backend.base.Backend`` implementation (what ``onnxruntime.backend`` offers)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from .session import InferenceSession


class OnnxpyBackendRep(BackendRep):
    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs, **kwargs):
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feed = inputs
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) < len(names):
                raise ValueError(f"The model expects {len(names)} inputs {names}, got {len(inputs)}")
            feed = dict(zip(names, inputs))
        else:
            if len(names) != 1:
                raise ValueError(f"The model expects {len(names)} inputs {names}, got a single value")
            feed = {names[0]: inputs}
        return self.session.run(None, feed)


class OnnxpyBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        if not cls.supports_device(device):
            raise RuntimeError(f"onnxpy only supports the CPU device, not '{device}'")
        if isinstance(model, InferenceSession):
            return OnnxpyBackendRep(model)
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        from .options import SessionOptions

        opts = SessionOptions()
        for k, v in kwargs.items():
            if hasattr(opts, k):
                setattr(opts, k, v)
        return OnnxpyBackendRep(InferenceSession(model, opts))

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on numpy inputs (a model is built around it with the given or latest opset)."""
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        ins = []
        feeds = {}
        for name, value in zip(node.input, inputs):
            if not name:
                continue
            arr = np.asarray(value)
            ins.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
            feeds[name] = arr
        outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = helper.make_graph([node], "run_node", ins, outs)
        opsets = [helper.make_opsetid("", opset)]
        if node.domain and node.domain != "ai.onnx":
            opsets.append(helper.make_opsetid(node.domain, 1 if node.domain != "ai.onnx.ml" else 5))
        model = helper.make_model(graph, opset_imports=opsets)
        return cls.prepare(model, device, **kwargs).run(feeds)


prepare = OnnxpyBackend.prepare
run_model = OnnxpyBackend.run_model
run_node = OnnxpyBackend.run_node
supports_device = OnnxpyBackend.supports_device
is_compatible = OnnxpyBackend.is_compatible
