"""IR dataclasses.  Treated as immutable once built: passes build new nodes rather than editing shared ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import dtypes


@dataclass
class TypeInfo:
    """The type of a value: tensor, sparse_tensor, sequence, map or optional (``elem`` nests)."""

    kind: str  # "tensor" | "sparse_tensor" | "sequence" | "map" | "optional" | "unknown"
    elem_type: int = 0  # tensor element type (map: key type is ``key_type``)
    shape: tuple | None = None  # dims as int | str (dim_param) | None (unknown); None = no shape info
    elem: TypeInfo | None = None  # element of a sequence/optional, value of a map
    key_type: int = 0
    denotations: tuple = ()  # dim denotations, aligned with ``shape``

    def ort_str(self) -> str:
        """onnxruntime's ``NodeArg.type`` string, e.g. ``tensor(float)``, ``seq(map(int64,tensor(float)))``."""
        if self.kind in ("tensor", "sparse_tensor"):
            return f"{self.kind}({dtypes.type_name(self.elem_type)})"
        if self.kind == "sequence":
            return f"seq({self.elem.ort_str() if self.elem else ''})"
        if self.kind == "map":
            return f"map({dtypes.type_name(self.key_type)},{self.elem.ort_str() if self.elem else ''})"
        if self.kind == "optional":
            return f"optional({self.elem.ort_str() if self.elem else ''})"
        return "unknown"

    @property
    def np_dtype(self) -> np.dtype | None:
        return dtypes.to_numpy(self.elem_type) if self.kind == "tensor" and self.elem_type else None


@dataclass
class ValueInfo:
    name: str
    type: TypeInfo | None = None
    doc_string: str = ""


@dataclass(eq=False)
class Node:
    """One operator application.  ``inputs``/``outputs`` use "" for an absent optional value.

    Nodes compare by identity: two nodes with the same fields are still two nodes (list removal, membership).
    """

    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)  # decoded; graph attributes are ``Graph``
    name: str = ""
    doc_string: str = ""

    def subgraphs(self):
        """The node's graph attributes (If branches, Loop/Scan bodies...) as a list, or () when it has none
        (checked without a generator: most nodes have none and the optimizer asks for every node)."""
        subs = None
        for v in self.attrs.values():
            if isinstance(v, Graph):
                (subs := subs or []).append(v)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                (subs := subs or []).extend(v)
        return subs or ()

    def describe(self) -> str:
        dom = self.domain or "ai.onnx"
        return f"{self.op_type} node '{self.name}' (domain {dom})"


@dataclass(eq=False)
class Graph:
    name: str
    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    initializers: dict[str, Any]  # name -> numpy array (or sparse-as-dense)
    value_info: dict[str, ValueInfo] = field(default_factory=dict)
    doc_string: str = ""
    sparse_initializer_names: frozenset = frozenset()


@dataclass
class Function:
    """A model-local function (FunctionProto), kept as protobuf until it is inlined at a call site."""

    domain: str
    name: str
    proto: Any  # onnx.FunctionProto


@dataclass
class Model:
    graph: Graph
    opsets: dict[str, int]
    ir_version: int = 0
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int | None = None
    doc_string: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    functions: dict[tuple[str, str], Function] = field(default_factory=dict)
    base_dir: str | None = None
    proto: Any = None  # the ModelProto it came from (kept for saving and for schema function bodies)
