"""NodeArg and ModelMetadata as onnxruntime shows them."""

from __future__ import annotations

INT64_MAX = 9223372036854775807


class NodeArg:
    __slots__ = ("name", "type", "shape")

    def __init__(self, name: str, type: str, shape: list):  # noqa: A002 - onnxruntime's field name
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self):
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"

    @classmethod
    def from_value_info(cls, vi, dim_overrides=None) -> NodeArg:
        t = vi.type
        if t is None:
            return cls(vi.name, "unknown", [])
        shape = []
        if t.kind == "optional" and t.elem is not None and t.elem.kind in ("tensor", "sparse_tensor"):
            t = t.elem  # onnxruntime shows the shape of an optional tensor's element
            return cls(vi.name, vi.type.ort_str(), [d for d in t.shape] if t.shape is not None else [])
        if t.kind in ("tensor", "sparse_tensor") and t.shape is not None:
            for i, d in enumerate(t.shape):
                if dim_overrides is not None:
                    d = dim_overrides(d, t.denotations[i] if i < len(t.denotations) else "")
                shape.append(d)
        return cls(vi.name, t.ort_str(), shape)


class ModelMetadata:
    __slots__ = ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
                 "custom_metadata_map")

    def __init__(self, producer_name="", graph_name="", domain="", description="", graph_description="",
                 version=INT64_MAX, custom_metadata_map=None):
        self.producer_name = producer_name
        self.graph_name = graph_name
        self.domain = domain
        self.description = description
        self.graph_description = graph_description
        self.version = version
        self.custom_metadata_map = dict(custom_metadata_map or {})
