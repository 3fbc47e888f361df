"""OrtValue: a value held by the runtime (tensor, sequence, map, optional) with onnxruntime's methods."""

from __future__ import annotations

import numpy as np

from . import dtypes


def _element_type(element_type) -> np.dtype:
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        return dtypes.to_numpy(int(element_type))
    return np.dtype(element_type)


class OrtValue:
    """Wraps a numpy array (zero-copy on CPU), a list (sequence), a dict (map) or None (empty optional)."""

    __slots__ = ("_value", "_device", "__weakref__")

    def __init__(self, value, device: str = "cpu"):
        self._value = value
        self._device = device

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj, device_type="cpu", device_id=0, vendor_id=-1):
        _check_device(device_type)
        arr = numpy_obj if isinstance(numpy_obj, np.ndarray) else np.asarray(numpy_obj)
        if arr.dtype.kind == "U":
            arr = arr.astype(object)
        return cls(arr)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, onnx_element_type):
        target = dtypes.to_numpy(int(onnx_element_type))
        arr = np.asarray(data)
        if arr.dtype.itemsize != target.itemsize:
            raise RuntimeError(
                f"ortvalue_from_numpy_with_onnx_type: element size {arr.dtype.itemsize} of {arr.dtype} does not "
                f"match {target}"
            )
        return cls(arr.view(target))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type, device_type="cpu", device_id=0, vendor_id=-1,
                                     memory_info=None):
        _check_device(device_type)
        dt = _element_type(element_type)
        return cls(np.zeros(tuple(int(s) for s in shape), dtype=dt))

    @classmethod
    def from_dlpack(cls, data, is_bool_tensor=False):
        arr = np.from_dlpack(data)
        if is_bool_tensor and arr.dtype == np.uint8:
            arr = arr.view(np.bool_)
        return cls(arr)

    # -- inspection --------------------------------------------------------------------------------
    def numpy(self):
        if not isinstance(self._value, np.ndarray):
            raise RuntimeError("numpy() is only supported for tensors; use the value through run() instead")
        return self._value

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        if dtype is not None:
            a = a.astype(dtype)
        return a.copy() if copy else a

    def shape(self):
        return list(self._value.shape) if isinstance(self._value, np.ndarray) else []

    def data_type(self) -> str:
        v = self._value
        if isinstance(v, np.ndarray):
            return f"tensor({dtypes.type_name(dtypes.from_numpy(v.dtype))})"
        if isinstance(v, list):
            inner = OrtValue(v[0]).data_type() if v else "tensor(float)"
            return f"seq({inner})"
        if isinstance(v, dict):
            return "map"
        return "optional"

    def element_type(self) -> int:
        return dtypes.from_numpy(self.numpy().dtype)

    def device_name(self) -> str:
        return self._device

    def has_value(self) -> bool:
        return self._value is not None

    def is_tensor(self) -> bool:
        return isinstance(self._value, np.ndarray)

    def is_sparse_tensor(self) -> bool:
        from .sparse import SparseTensor

        return isinstance(self._value, SparseTensor)

    @classmethod
    def ort_value_from_sparse_tensor(cls, sparse_tensor):
        return cls(sparse_tensor)

    def as_sparse_tensor(self):
        if not self.is_sparse_tensor():
            raise RuntimeError("This OrtValue does not hold a sparse tensor")
        return self._value

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def tensor_size_in_bytes(self) -> int:
        return int(self.numpy().nbytes)

    def data_ptr(self) -> int:
        return int(self.numpy().__array_interface__["data"][0])

    def update_inplace(self, np_arr) -> None:
        src = np_arr.numpy() if isinstance(np_arr, OrtValue) else np.asarray(np_arr)
        dst = self.numpy()
        if src.shape != dst.shape:
            raise RuntimeError(f"update_inplace: shape {list(src.shape)} does not match {list(dst.shape)}")
        np.copyto(dst, src, casting="unsafe")

    def __dlpack__(self, stream=None):
        return self.numpy().__dlpack__()

    def __dlpack_device__(self):
        return self.numpy().__dlpack_device__()

    def to_dlpack(self):
        return self.numpy().__dlpack__()

    def __repr__(self):
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


def _check_device(device_type: str) -> None:
    if str(device_type).lower() != "cpu":
        raise RuntimeError(f"Unsupported device type '{device_type}': onnxpy runs on 'cpu'")
