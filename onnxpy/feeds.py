"""Feed conversion and checks with onnxruntime's behaviour and error texts (plus onnxpy's extras).

Lists take the declared dtype, object/str/bytes arrays become str tensors, OrtValue and SparseTensor are
unwrapped, numpy scalars are 0-d tensors; wrong types, ranks and fixed dims raise InvalidArgument with
onnxruntime's messages; sequences and maps are checked element by element.
"""

from __future__ import annotations

import numpy as np

from . import dtypes
from .capi.onnxruntime_pybind11_state import InvalidArgument
from .ortvalue import OrtValue
from .sparse import SparseTensor


def convert_feed(feed_specs: dict, name: str, value):
    """(slot, value) for one feed: OrtValue/SparseTensor unwrapped, lists converted, types and dims checked."""
    spec = feed_specs.get(name)
    if spec is None:
        raise InvalidArgument.make(f"Invalid input name: {name}")
    slot, t, shape = spec
    if isinstance(value, OrtValue):
        value = value._value
    if isinstance(value, SparseTensor):
        value = value.to_dense()
    kind = t.kind if t is not None else "tensor"
    if kind == "sparse_tensor":
        kind = "tensor"
    if kind == "optional":
        if value is None:
            return slot, None
        t = t.elem
        kind = t.kind if t is not None else "tensor"
    if kind == "tensor":
        return slot, convert_tensor(name, value, t, shape)
    if kind == "sequence":
        if isinstance(value, np.ndarray):  # onnxruntime's text (3: its code for a sequence)
            raise InvalidArgument.make(f"input with name: '{name}' expected to be of type: 3 but received a tensor")
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument.make(
                f"Unexpected input data type for '{name}': expected a list (seq), got {type(value).__name__}"
            )
        et = t.elem if t is not None else None
        return slot, [convert_tensor(name, np.asarray(x) if et is None else x, et, None) for x in value]
    if kind == "map":
        if isinstance(value, np.ndarray):  # onnxruntime's text
            raise InvalidArgument.make(f"input with name: '{name}' expected to be of type: 1 but received a tensor")
        if not isinstance(value, dict):
            raise InvalidArgument.make(f"Input '{name}' expects a map (dict), got {type(value).__name__}")
        if not value:
            raise RuntimeError("Size of dictionary is empty, unable to run the prediction.")
        _check_map_keys(value, t)
        vt = t.elem.np_dtype if t is not None and t.elem is not None else None
        if vt is not None and vt.kind != "O":
            value = {k: vt.type(v) for k, v in value.items()}
        return slot, value
    return slot, value

def convert_tensor(name, value, t, shape):
    want = t.np_dtype if t is not None else None
    if not isinstance(value, np.ndarray):
        if isinstance(value, (list, tuple)):  # a tuple is an onnxpy extra (onnxruntime takes lists only)
            try:
                value = np.asarray(value, dtype=want if want is not None and want.kind != "O" else None)
            except (ValueError, TypeError):
                raise RuntimeError("Could not create tensor from given input list") from None
            if value.dtype == object and want != np.dtype(object):
                raise RuntimeError("Could not create tensor from given input list")
        elif value is None:
            raise InvalidArgument.make(f"Input '{name}' is None but the model expects a tensor")
        elif isinstance(value, dict):
            raise _map_for_tensor(name, value, t)
        elif isinstance(value, (np.number, np.bool_)):  # onnxpy extra: onnxruntime refuses numpy scalars
            value = np.asarray(value)
        elif isinstance(value, (int, float, complex)):
            raise RuntimeError(f"Unable to handle object of type {type(value)}")
        else:
            raise RuntimeError(f"Input must be a list of dictionaries or a single numpy array for input '{name}'.")
    if not value.dtype.isnative:  # onnxruntime reads big-endian buffers as if native; onnxpy converts them
        value = value.astype(value.dtype.newbyteorder("="))
    if want == np.dtype(object) and value.dtype.kind in "USO":
        value = _as_strings(value)
    if want is not None and value.dtype != want:
        got, exp = _type_str(value.dtype), dtypes.type_name(t.elem_type)
        raise InvalidArgument.make(
            f"Unexpected input data type. Actual: (tensor({got})) , expected: (tensor({exp}))"
        )
    if shape and value.ndim != len(shape):
        raise InvalidArgument.make(
            f"Invalid rank for input: {name} Got: {value.ndim} Expected: {len(shape)} Please fix either the "
            "inputs/outputs or the model."
        )
    if shape:
        bad = [(i, g, e) for i, (g, e) in enumerate(zip(value.shape, shape)) if isinstance(e, int) and g != e]
        if bad:
            lines = "".join(f"\n index: {i} Got: {g} Expected: {e}" for i, g, e in bad)
            raise InvalidArgument.make(
                f"Got invalid dimensions for input: {name} for the following indices{lines}\n Please fix "
                "either the inputs/outputs or the model."
            )
    return value


def _as_strings(value: np.ndarray) -> np.ndarray:
    """A string tensor as an object array of ``str``: bytes are decoded (UTF-8), other objects go through ``str()``.

    onnxruntime applies ``str()`` to every element (``b'a'`` becomes ``"b'a'"``) and misreads fixed-width ``S``
    arrays; onnxpy decodes bytes instead.
    """
    if value.dtype.kind == "U":
        return value.astype(object)
    if value.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(value) if value.size else \
            value.astype(object)
    flat = value.reshape(-1)
    if all(type(v) is str for v in flat):
        return value
    conv = [v if type(v) is str else (bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, np.bytes_))
                                      else str(v)) for v in flat]
    out = np.empty(value.shape, dtype=object)
    out.reshape(-1)[:] = conv
    return out


def _py_map(d: dict) -> dict:
    """A map output with Python keys and values (int/str/float), as onnxruntime returns it."""
    return {(k.item() if isinstance(k, np.generic) else k): (v.item() if isinstance(v, np.generic) else v)
            for k, v in d.items()}


def _check_map_keys(value: dict, t) -> None:
    """onnxruntime refuses a dict whose key kind (str/int) differs from the declared map key type."""
    if t is None or not t.key_type:
        return
    want_str = t.key_type == 8  # STRING
    k = next(iter(value))
    if isinstance(k, (str, np.str_)) != want_str:
        got = "string" if isinstance(k, str) else "int64"
        exp = f"map({dtypes.type_name(t.key_type)},{t.elem.ort_str() if t.elem is not None else ''})"
        raise InvalidArgument.make(
            f"Unexpected input data type. Actual: ((map({got},tensor(float)))) , expected: (({exp}))")


def _map_for_tensor(name, value: dict, t):
    """onnxruntime's error for a dict fed where a tensor is expected."""
    k = next(iter(value), "")
    v = value[k] if value else 0.0
    if isinstance(v, str):
        return RuntimeError(
            f"Unexpected value type  {type(v)}, it cannot be linked to C type string for input '{name}'.")
    key = "string" if isinstance(k, str) else "int64"
    exp = f"tensor({dtypes.type_name(t.elem_type)})" if t is not None and t.elem_type else "tensor"
    return InvalidArgument.make(
        f"Unexpected input data type. Actual: ((map({key},tensor(float)))) , expected: (({exp}))")


def _type_str(dt) -> str:
    try:
        return dtypes.type_name(dtypes.from_numpy(dt))
    except TypeError:
        return str(dt)
