"""ModelProto -> onnxpy IR.  The only module that reads protobuf model structure.

External data is resolved relative to the model's folder and refused when its path escapes that folder
(``..``, absolute paths, symlinks pointing outside) or its offset/length run past the end of the file.
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np

from .. import dtypes
from ..capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf, NoSuchFile
from . import proto as proto_mod
from . import wire
from .model import Function, Graph, Model, Node, TypeInfo, ValueInfo
from .protoenums import AttributeProto, TensorProto

MAX_FUNCTION_DEPTH = 64
_WIRE = True  # models read by onnxpy.ir.wire where it can (test and measurement hook)


def parse_model_bytes(data, error: str, fast: bool = False):
    """Parse serialized model bytes into onnx's ModelProto class (loaded without importing onnx, see
    :mod:`onnxpy.ir.proto`).  ``error``: the InvalidProtobuf text when protobuf refuses the bytes.  With ``fast``
    the result may instead be :mod:`onnxpy.ir.wire`'s light objects (no protobuf import), where they cover the
    model: enough for :func:`model_from_proto`, not a protobuf message."""
    if fast and _WIRE:
        try:
            return wire.decode_model(data)
        except wire.Unsupported:
            pass  # protobuf parses it (and reports what is wrong with it)
    model = proto_mod.messages().ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        raise InvalidProtobuf.make(error) from None
    return model


def read_model_proto(path_or_bytes, fast: bool = False) -> tuple:
    """Parse a model from a path, bytes or a ModelProto; returns the message and its folder (None for bytes).

    The message is an ``onnx.ModelProto`` (the class, even when onnx itself is not imported); with ``fast``, where
    :mod:`onnxpy.ir.wire` covers the model, its light objects instead (what session creation reads).
    """
    if hasattr(path_or_bytes, "SerializeToString") and hasattr(path_or_bytes, "graph"):
        return path_or_bytes, None
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return parse_model_bytes(bytes(path_or_bytes), "Failed to load model because protobuf parsing failed.",
                                 fast), None
    path = os.fspath(path_or_bytes)
    if not os.path.exists(path):
        raise NoSuchFile.make(f"Load model from {path} failed:Load model {path} failed. File doesn't exist")
    if os.path.isdir(path):
        raise NoSuchFile.make(f"Load model from {path} failed: it is a directory, not a model file")
    with open(path, "rb") as f:
        data = f.read()
    model = parse_model_bytes(data, f"Load model from {path} failed:Protobuf parsing failed.", fast)
    return model, os.path.dirname(os.path.abspath(path))


# ----------------------------------------------------------------------------------------------------------
# tensors


def _external_path(base_dir: str | None, location: str, tensor_name: str) -> str:
    if base_dir is None:
        raise Fail.make(
            f"Tensor '{tensor_name}' has external data '{location}' but the model was loaded from bytes; "
            "load it from a path so the data file can be found"
        )
    if os.path.isabs(location) or location.startswith(("/", "\\")):
        raise Fail.make(f"External data path '{location}' of tensor '{tensor_name}' must be relative to the model")
    key = (base_dir, location)
    full = _RESOLVED.get(key)
    if full is not None:
        return full
    base = os.path.realpath(base_dir)
    full = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([base, full]) != base:
        raise Fail.make(
            f"External data path '{location}' of tensor '{tensor_name}' escapes the model folder '{base_dir}'"
        )
    if not os.path.isfile(full):
        raise NoSuchFile.make(f"External data file '{location}' of tensor '{tensor_name}' does not exist")
    _RESOLVED[key] = full
    return full


# (model folder, location) -> checked real path, for the tensors of the model being loaded (most share one data
# file; resolving symlinks costs ~40 us a tensor).  Emptied at the start of every load, so a path is checked again
# for each model (a link changed between loads is seen).
_RESOLVED: dict = {}


def _external_span(t: TensorProto, base_dir: str | None) -> tuple[str, int, int]:
    """(file, offset, length) of a tensor's external data, checked to lie inside the model folder and the file."""
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    full = _external_path(base_dir, location, t.name)
    size = os.path.getsize(full)
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else size - offset
    except ValueError:
        raise Fail.make(
            f"External data of tensor '{t.name}' has a non-integer offset/length "
            f"({info.get('offset')!r}, {info.get('length')!r})"
        ) from None
    if offset < 0 or length < 0 or offset + length > size:
        raise Fail.make(
            f"External data of tensor '{t.name}' (offset {offset}, length {length}) lies past the end of "
            f"'{location}' ({size} bytes)"
        )
    return full, offset, length


def _read_external(t: TensorProto, base_dir: str | None) -> bytes:
    full, offset, length = _external_span(t, base_dir)
    with open(full, "rb") as f:
        f.seek(offset)
        return f.read(length)


# Element types whose external bytes are the array itself (little-endian): read straight into the array, one copy
# instead of three (bytes, protobuf field, array) -- the peak memory of loading a large model.
_PLAIN = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
          TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
          TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
          TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_}


def _plain_external(t: TensorProto, base_dir: str | None) -> np.ndarray | None:
    dt = _PLAIN.get(t.data_type)
    if dt is None or sys.byteorder != "little":
        return None
    full, offset, length = _external_span(t, base_dir)
    count = int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
    if count * np.dtype(dt).itemsize != length:
        return None  # the generic decoder reports the size mismatch
    if length >= _MMAP_MIN and offset % np.dtype(dt).itemsize == 0 and _mmap_enabled():
        arr = _mapped(full, dt, count, offset, length)
        if arr is not None:
            arr.shape = tuple(t.dims)
            return arr
    arr = np.fromfile(full, dtype=dt, count=count, offset=offset)
    if arr.size != count:
        return None
    arr.shape = tuple(t.dims)  # in place: the array keeps owning its memory (no base), so it can be frozen
    return arr


# External tensors of at least this many bytes are memory-mapped from their file (read-only, as onnxruntime maps
# external initializers on CPU) instead of read into a copy: reading BERT-base's 440 MB of weights took ~230 ms
# (2 GB/s into freshly faulted memory), mapping them ~25 ms, and the level-99 Fortran copies read the pages straight
# from the page cache.  Each tensor gets its own mapping, so a weight the optimizer replaces (folded, re-laid out)
# is unmapped with its array.  As with onnxruntime, a data file must not be truncated or rewritten in place while a
# session uses it; ``ONNXPY_MMAP_EXTERNAL=0`` reads every tensor into memory instead.
_MMAP_MIN = 1 << 20


# Linux: the file's pages are mapped with the file (MAP_POPULATE, one pass in the kernel, no copy): faulting them in
# one at a time as the arrays are first read cost more than reading the file.
_MAP_KW = (dict(flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ) if hasattr(mmap, "MAP_POPULATE")
           else dict(access=mmap.ACCESS_READ))


def _mmap_enabled() -> bool:
    return os.environ.get("ONNXPY_MMAP_EXTERNAL", "1") != "0"


def _mapped(full: str, dt, count: int, offset: int, length: int) -> np.ndarray | None:
    """A read-only array over ``length`` bytes at ``offset`` of ``full``, memory-mapped; None where the file can't
    be mapped (the caller then reads it)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        with open(full, "rb") as f:
            m = mmap.mmap(f.fileno(), offset + length - start, offset=start, **_MAP_KW)
            if os.fstat(f.fileno()).st_size < offset + length:  # (shrunk since it was checked: pages past the end
                m.close()                                         # of a file fault with SIGBUS when read)
                return None
    except (OSError, ValueError, OverflowError):
        return None
    return np.frombuffer(m, dtype=dt, count=count, offset=offset - start)


def tensor_to_array(t, base_dir: str | None = None) -> np.ndarray:
    """Decode a TensorProto (inline or external data) to a numpy array with the right dtype."""
    if any(d < 0 for d in t.dims):
        raise InvalidGraph.make(f"Tensor '{t.name}' has negative dimension(s) {list(t.dims)}")
    raw = None
    if t.data_location == TensorProto.EXTERNAL:
        arr = _plain_external(t, base_dir)
        if arr is not None:
            return arr
        raw = _read_external(t, base_dir)
    try:
        want = dtypes.to_numpy(t.data_type)
    except TypeError:
        want = None
    try:
        arr = proto_mod.tensor_array(t, raw, want)
    except ValueError as e:
        raise InvalidGraph.make(f"Cannot decode tensor '{t.name}': {e}") from None
    if arr is not None:
        return arr
    from onnx import numpy_helper

    if isinstance(t, wire.Message):
        t = t.to_protobuf()
    if raw is not None:
        shallow = type(t)()
        shallow.CopyFrom(t)
        del shallow.external_data[:]
        shallow.data_location = TensorProto.DEFAULT
        shallow.raw_data = raw
        t = shallow
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise InvalidGraph.make(f"Cannot decode tensor '{t.name}': {e}") from None
    if t.data_type == TensorProto.STRING:
        arr = _strings(arr)
    return arr


def _strings(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        flat[i] = v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v
    return out


def sparse_to_dense(sp, base_dir: str | None = None) -> np.ndarray:
    """Decode a SparseTensorProto (COO, linear or per-dim indices) to a dense numpy array."""
    values = tensor_to_array(sp.values, base_dir)
    indices = tensor_to_array(sp.indices, base_dir).astype(np.int64)
    shape = tuple(int(d) for d in sp.dims)
    dense = np.zeros(shape, dtype=values.dtype)
    if values.size:
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values.reshape(-1)
        else:
            dense[tuple(indices.T)] = values.reshape(-1)
    return dense


# ----------------------------------------------------------------------------------------------------------
# types and attributes


def decode_type(tp) -> TypeInfo | None:
    """TypeProto -> TypeInfo (None when the proto carries no type)."""
    which = tp.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = getattr(tp, which)
        shape = None
        den = ()
        if tt.HasField("shape"):
            dims = []
            for d in tt.shape.dim:
                w = d.WhichOneof("value")
                if w == "dim_value":  # a negative dim_value means "unknown", as onnxruntime treats it
                    dims.append(int(d.dim_value) if d.dim_value >= 0 else None)
                else:
                    dims.append(d.dim_param if w == "dim_param" else None)
            shape = tuple(dims)
            den = tuple(d.denotation for d in tt.shape.dim)
        kind = "tensor" if which == "tensor_type" else "sparse_tensor"
        return TypeInfo(kind, int(tt.elem_type), shape, denotations=den)
    if which == "sequence_type":
        return TypeInfo("sequence", elem=decode_type(tp.sequence_type.elem_type))
    if which == "map_type":
        return TypeInfo("map", key_type=int(tp.map_type.key_type), elem=decode_type(tp.map_type.value_type))
    if which == "optional_type":
        return TypeInfo("optional", elem=decode_type(tp.optional_type.elem_type))
    return None


def _decode_str(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")


def decode_attribute(a: AttributeProto, ctx: _Loader):
    t = a.type
    if t == AttributeProto.FLOAT:
        return float(a.f)
    if t == AttributeProto.INT:
        return int(a.i)
    if t == AttributeProto.STRING:
        return _decode_str(a.s)
    if t == AttributeProto.TENSOR:
        return tensor_to_array(a.t, ctx.base_dir)
    if t == AttributeProto.GRAPH:
        return ctx.graph(a.g)
    if t == AttributeProto.SPARSE_TENSOR:
        return sparse_to_dense(a.sparse_tensor, ctx.base_dir)
    if t == AttributeProto.TYPE_PROTO:
        return decode_type(a.tp)
    if t == AttributeProto.FLOATS:
        return [float(x) for x in a.floats]
    if t == AttributeProto.INTS:
        return [int(x) for x in a.ints]
    if t == AttributeProto.STRINGS:
        return [_decode_str(x) for x in a.strings]
    if t == AttributeProto.TENSORS:
        return [tensor_to_array(x, ctx.base_dir) for x in a.tensors]
    if t == AttributeProto.GRAPHS:
        return [ctx.graph(g) for g in a.graphs]
    if t == AttributeProto.SPARSE_TENSORS:
        return [sparse_to_dense(x, ctx.base_dir) for x in a.sparse_tensors]
    if t == AttributeProto.TYPE_PROTOS:
        return [decode_type(x) for x in a.type_protos]
    # Old models sometimes leave ``type`` unset: infer it from the populated field.
    if t == AttributeProto.UNDEFINED:
        for field, conv in (("f", float), ("i", int)):
            if a.HasField(field):
                return conv(getattr(a, field))
        if a.HasField("s"):
            return _decode_str(a.s)
        if a.HasField("t"):
            return tensor_to_array(a.t, ctx.base_dir)
        if a.HasField("g"):
            return ctx.graph(a.g)
        if len(a.floats):
            return [float(x) for x in a.floats]
        if a.ints:
            return [int(x) for x in a.ints]
        if a.strings:
            return [_decode_str(x) for x in a.strings]
    raise InvalidGraph.make(f"Attribute '{a.name}' has unsupported type {t}")


# ----------------------------------------------------------------------------------------------------------
# graphs and function inlining


class _Loader:
    def __init__(self, base_dir: str | None, functions: dict, opsets: dict):
        self.base_dir = base_dir
        self.functions = functions  # (domain, name) -> FunctionProto
        self.opsets = opsets
        self._counter = 0

    def graph(self, g) -> Graph:
        inits = {}
        for t in g.initializer:
            inits[t.name] = tensor_to_array(t, self.base_dir)
        sparse_names = set()
        for sp in g.sparse_initializer:
            name = sp.values.name
            inits[name] = sparse_to_dense(sp, self.base_dir)
            sparse_names.add(name)
        nodes: list[Node] = []
        for n in g.node:
            self._append_node(n, nodes, depth=0)
        vi = {v.name: ValueInfo(v.name, decode_type(v.type), v.doc_string) for v in g.value_info}
        return Graph(
            name=g.name,
            nodes=nodes,
            inputs=[ValueInfo(v.name, decode_type(v.type), v.doc_string) for v in g.input],
            outputs=[ValueInfo(v.name, decode_type(v.type), v.doc_string) for v in g.output],
            initializers=inits,
            value_info=vi,
            doc_string=g.doc_string,
            sparse_initializer_names=frozenset(sparse_names),
        )

    def _append_node(self, n, out: list[Node], depth: int) -> None:
        key = (n.domain, n.op_type)
        if key in self.functions and depth < MAX_FUNCTION_DEPTH:
            for inner in self.inline_function(self.functions[key], n):
                self._append_node(inner, out, depth + 1)
            return
        if key in self.functions:
            raise InvalidGraph.make(f"Function '{n.op_type}' nests deeper than {MAX_FUNCTION_DEPTH} levels")
        attrs = {a.name: decode_attribute(a, self) for a in n.attribute}
        out.append(Node(n.op_type, n.domain, list(n.input), list(n.output), attrs, n.name, n.doc_string))

    def inline_function(self, fn, call) -> list:
        """Expand a FunctionProto at a call site: rename locals, bind formals, substitute attribute refs."""
        self._counter += 1
        prefix = f"_fn{self._counter}_{call.op_type}_"
        rename = {}
        for formal, actual in zip(fn.input, call.input):
            rename[formal] = actual
        for formal in list(fn.input)[len(call.input):]:
            rename[formal] = ""
        for formal, actual in zip(fn.output, call.output):
            rename[formal] = actual
        call_attrs = {a.name: a for a in call.attribute}
        defaults = {a.name: a for a in fn.attribute_proto}
        nodes = []
        for n in fn.node:
            m = type(n)()
            m.CopyFrom(n)
            m.name = prefix + (n.name or n.op_type)
            del m.input[:]
            del m.output[:]
            m.input.extend(rename.get(x, prefix + x) if x else "" for x in n.input)
            m.output.extend(rename.get(x, prefix + x) if x else "" for x in n.output)
            self._bind_attrs(m, call_attrs, defaults)
            self._rename_subgraphs(m, rename, prefix)
            nodes.append(m)
        return nodes

    @staticmethod
    def _bind_attrs(m, call_attrs, defaults) -> None:
        kept = []
        for a in m.attribute:
            if a.ref_attr_name:
                src = call_attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue  # unbound optional attribute: the op's own default applies
                b = type(src)()
                b.CopyFrom(src)
                b.name = a.name
                kept.append(b)
            else:
                kept.append(a)
        del m.attribute[:]
        m.attribute.extend(kept)

    def _rename_subgraphs(self, m, rename, prefix) -> None:
        """Outer-scope names used inside subgraph attributes follow the renaming of the function body."""
        for a in m.attribute:
            graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
            for g in graphs:
                local = {v.name for v in g.input} | {t.name for t in g.initializer}
                local |= {o for n in g.node for o in n.output}
                for n in g.node:
                    for i, x in enumerate(n.input):
                        if x and x not in local:
                            n.input[i] = rename.get(x, prefix + x)
                for o in g.output:
                    if o.name not in local:
                        o.name = rename.get(o.name, prefix + o.name)


def _bad_text(values) -> str | None:
    for v in values:
        if not isinstance(v, str):
            return repr(v)[:60]
    return None


def _check_text(proto) -> None:
    """Names, op types and domains must be text: protobuf hands back ``bytes`` for invalid UTF-8 in proto2
    string fields, which would otherwise surface as TypeErrors deep inside the loader/planner."""
    def graph(g, where):
        for coll in (g.input, g.output, g.value_info, g.initializer):
            bad = _bad_text(x.name for x in coll)
            if bad:
                raise InvalidProtobuf.make(f"{where}: a value name is not valid UTF-8 ({bad})")
        nodes(g.node, where)

    def nodes(ns, where):
        for n in ns:
            bad = _bad_text([n.name, n.op_type, n.domain, *n.input, *n.output, *(a.name for a in n.attribute)])
            if bad:
                raise InvalidProtobuf.make(f"{where}: node '{n.name!r}' has a field that is not valid UTF-8 ({bad})")
            for a in n.attribute:
                if a.HasField("g"):
                    graph(a.g, where)
                for sub in a.graphs:
                    graph(sub, where)

    bad = _bad_text(o.domain for o in proto.opset_import)
    if bad:
        raise InvalidProtobuf.make(f"An opset_import domain is not valid UTF-8 ({bad})")
    graph(proto.graph, "main graph")
    for f in proto.functions:
        bad = _bad_text([f.name, f.domain, *f.input, *f.output, *f.attribute, *(o.domain for o in f.opset_import)])
        if bad:
            raise InvalidProtobuf.make(f"Function '{f.name!r}' has a field that is not valid UTF-8 ({bad})")
        nodes(f.node, f"function {f.name!r}")


def load_model(path_or_bytes) -> Model:
    """Read and convert a model (path, bytes or ModelProto) to the IR (``Model.proto``: the parsed message, onnx's
    class or :mod:`onnxpy.ir.wire`'s light objects)."""
    proto, base_dir = read_model_proto(path_or_bytes, fast=True)
    return model_from_proto(proto, base_dir)


def model_from_proto(proto, base_dir: str | None = None) -> Model:
    _RESOLVED.clear()
    if not proto.HasField("graph"):
        raise InvalidGraph.make("The model has no graph")
    _check_text(proto)
    opsets = {}
    for o in proto.opset_import:
        opsets["" if o.domain == "ai.onnx" else o.domain] = int(o.version)
    if not proto.opset_import:
        opsets[""] = 1
    functions = {(f.domain, f.name): f for f in proto.functions}
    loader = _Loader(base_dir, functions, opsets)
    graph = loader.graph(proto.graph)
    return Model(
        graph=graph,
        opsets=opsets,
        ir_version=int(proto.ir_version),
        producer_name=proto.producer_name,
        producer_version=proto.producer_version,
        domain=proto.domain,
        model_version=int(proto.model_version) if proto.HasField("model_version") else None,
        doc_string=proto.doc_string,
        metadata={p.key: p.value for p in proto.metadata_props},
        functions={k: Function(k[0], k[1], v) for k, v in functions.items()},
        base_dir=base_dir,
        proto=proto,
    )


__all__ = ["load_model", "model_from_proto", "tensor_to_array", "decode_type", "read_model_proto", "dtypes"]
