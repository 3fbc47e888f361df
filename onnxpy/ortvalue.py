"""OrtValue: a value held by the runtime (tensor, sequence, map, optional) with onnxruntime's methods."""

from __future__ import annotations

import numpy as np

from . import dtypes


def _element_type(element_type) -> np.dtype:
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        try:
            return dtypes.to_numpy(int(element_type))
        except TypeError:
            raise RuntimeError(f"tensor type {int(element_type)} is not supported") from None
    dt = np.dtype(element_type)
    return np.dtype(object) if dt.kind in "USO" else dt  # string tensors are object arrays of str


_NOT_TENSOR = "IsTensor() was false. Only OrtValues that are Tensors are currently supported"


def _packed_nbytes(arr: np.ndarray) -> int:
    """Bytes onnxruntime uses for a tensor: 4-bit types hold two elements a byte, 2-bit types four."""
    name = arr.dtype.name
    if name in ("int4", "uint4", "float4_e2m1fn"):
        return (arr.size + 1) // 2
    if name in ("int2", "uint2"):
        return (arr.size + 3) // 4
    return int(arr.nbytes)


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
        # numpy scalars, lists, string and ml_dtypes arrays are onnxpy extras (onnxruntime refuses them)
        arr = numpy_obj if isinstance(numpy_obj, np.ndarray) else np.asarray(numpy_obj)
        if arr.dtype.kind in "US":
            from .feeds import _as_strings

            arr = _as_strings(arr)
        elif not arr.flags.c_contiguous or not arr.dtype.isnative:
            # like onnxruntime, a non-contiguous array is copied so data_ptr() addresses a dense buffer
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
        return cls(arr)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, onnx_element_type):
        try:
            target = dtypes.to_numpy(int(onnx_element_type))
        except TypeError:
            raise RuntimeError(f"Not a valid ONNX Tensor data type: {int(onnx_element_type)}") from None
        arr = np.ascontiguousarray(data)
        if arr.dtype.itemsize != target.itemsize:
            raise RuntimeError(
                f"Items size in the incoming array: {arr.dtype.itemsize} specified by onnxtype: {target.itemsize}"
            )
        return cls(arr.view(target))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type, device_type="cpu", device_id=0, vendor_id=-1,
                                     memory_info=None):
        _check_device(device_type)
        dt = _element_type(element_type)
        dims = tuple(int(s) for s in shape)
        if any(d < 0 for d in dims):
            raise RuntimeError(f"Invalid shape {list(dims)}: Tensor shape.Size() must be >= 0")
        arr = np.zeros(dims, dtype=dt)
        if dt == np.dtype(object):
            arr[...] = ""
        return cls(arr)

    @classmethod
    def from_dlpack(cls, data, is_bool_tensor=False):
        arr = np.from_dlpack(data)
        if is_bool_tensor and arr.dtype == np.uint8:
            arr = arr.view(np.bool_)
        return cls(arr)

    # -- inspection --------------------------------------------------------------------------------
    def numpy(self):
        if not isinstance(self._value, np.ndarray):
            raise RuntimeError("IsTensor() was false. Only OrtValues that are Tensors are convertible to Numpy objects")
        return self._value

    def _tensor(self) -> np.ndarray:
        if not isinstance(self._value, np.ndarray):
            raise RuntimeError(_NOT_TENSOR)
        return self._value

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        if dtype is not None:
            a = a.astype(dtype)
        return a.copy() if copy else a

    def shape(self):
        v = self._value
        if isinstance(v, np.ndarray):
            return list(v.shape)
        if self.is_sparse_tensor():
            return v.dense_shape()
        raise RuntimeError("IsSparseTensor() was false. Only OrtValues that are Tensors/SpareTensors are currently "
                           "supported")

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
        v = self._value
        if isinstance(v, list):  # a sequence: its tensors' element type (onnxruntime's answer)
            return OrtValue(v[0]).element_type() if v else 1
        if self.is_sparse_tensor():
            return dtypes.from_numpy(v.values().dtype)
        return dtypes.from_numpy(self._tensor().dtype)

    def device_name(self) -> str:
        if not isinstance(self._value, np.ndarray) and not self.is_sparse_tensor():
            raise RuntimeError("Only OrtValues that are Tensors/SparseTensors are currently supported")
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
        return _packed_nbytes(self._tensor())

    def data_ptr(self) -> int:
        return int(self._tensor().__array_interface__["data"][0])

    def update_inplace(self, np_arr) -> None:
        if isinstance(np_arr, OrtValue):
            src = np_arr._tensor()
        elif isinstance(np_arr, np.ndarray):
            src = np_arr
        else:
            raise TypeError("data must be a numpy.ndarray or an OrtValue.")
        dst = self._tensor()
        if src.size != dst.size:
            raise RuntimeError("The input size of numpy arrays does not match the size of the OrtValue.")
        # onnxruntime copies raw bytes whatever the dtype; onnxpy converts the values to the OrtValue's type
        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")

    def __dlpack__(self, stream=None):
        return self.numpy().__dlpack__()

    def __dlpack_device__(self):
        return self.numpy().__dlpack_device__()

    def to_dlpack(self):
        return self.numpy().__dlpack__()

    def __repr__(self):
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


_KNOWN_DEVICES = ("cuda", "gpu", "dml", "cann", "npu", "webgpu", "migraphx")


def _check_device(device_type: str) -> None:
    dev = str(device_type).lower()
    if dev == "cpu":
        return
    if dev in _KNOWN_DEVICES:  # onnxruntime's text on a CPU-only build
        raise RuntimeError("Can't allocate memory on the device using this package of OnnxRuntime. Please use the "
                           "appropriate package of OnnxRuntime for your hardware to use this feature.")
    raise RuntimeError(f"Unsupported device type: {device_type}")
