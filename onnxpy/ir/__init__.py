"""onnxpy's in-memory model: the only types passes, the planner and kernels see (protobuf stops in load.py)."""

from .model import Function, Graph, Model, Node, TypeInfo, ValueInfo

__all__ = ["Function", "Graph", "Model", "Node", "TypeInfo", "ValueInfo"]
