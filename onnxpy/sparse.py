"""SparseTensor (COO and CSR) with onnxruntime's Python API; fed to a session it is densified.

onnxpy's kernels work on dense arrays: a SparseTensor input (or an OrtValue holding one) is turned into the
dense tensor it describes before the run, which is exact (sparse kernels would only be faster).
"""

from __future__ import annotations

import enum

import numpy as np

from . import dtypes


class OrtSparseFormat(enum.IntEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


class _View:
    def __init__(self, **arrays):
        self._arrays = arrays

    def __getattr__(self, name):
        try:
            return lambda: self._arrays[name]
        except KeyError:  # pragma: no cover
            raise AttributeError(name) from None


class SparseTensor:
    def __init__(self, fmt: OrtSparseFormat, dense_shape, values, indices=None, inner=None, outer=None):
        self.format = fmt
        self._shape = [int(d) for d in dense_shape]
        self._values = np.asarray(values)
        self._indices = None if indices is None else np.asarray(indices, dtype=np.int64)
        self._inner = None if inner is None else np.asarray(inner, dtype=np.int64)
        self._outer = None if outer is None else np.asarray(outer, dtype=np.int64)
        if fmt == OrtSparseFormat.ORT_SPARSE_COO:
            n = self._values.size
            if self._indices.size not in (n, n * len(self._shape)):
                raise ValueError(f"COO indices must hold {n} linear or {n}x{len(self._shape)} coordinates, got "
                                 f"{self._indices.shape}")
        elif fmt == OrtSparseFormat.ORT_SPARSE_CSRC and len(self._shape) != 2:
            raise ValueError(f"CSR needs a 2-D dense shape, got {self._shape}")

    @classmethod
    def sparse_coo_from_numpy(cls, dense_shape, values, coo_indices, ort_device=None):
        return cls(OrtSparseFormat.ORT_SPARSE_COO, dense_shape, values, indices=coo_indices)

    @classmethod
    def sparse_csr_from_numpy(cls, dense_shape, values, inner_indices, outer_indices, ort_device=None):
        return cls(OrtSparseFormat.ORT_SPARSE_CSRC, dense_shape, values, inner=inner_indices, outer=outer_indices)

    def values(self):
        return self._values

    def dense_shape(self):
        return list(self._shape)

    def data_type(self) -> str:
        return f"sparse_tensor({dtypes.type_name(dtypes.from_numpy(self._values.dtype))})"

    def device_name(self) -> str:
        return "cpu"

    def as_coo_view(self):
        if self.format != OrtSparseFormat.ORT_SPARSE_COO:
            raise RuntimeError("This sparse tensor is not in COO format")
        return _View(indices=self._indices)

    def as_csrc_view(self):
        if self.format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise RuntimeError("This sparse tensor is not in CSR format")
        return _View(inner=self._inner, outer=self._outer)

    def to_dense(self) -> np.ndarray:
        dense = np.zeros(self._shape, dtype=self._values.dtype)
        vals = self._values.reshape(-1)
        if self.format == OrtSparseFormat.ORT_SPARSE_COO:
            idx = self._indices
            if idx.size == vals.size:
                dense.reshape(-1)[idx.reshape(-1)] = vals
            else:
                dense[tuple(idx.reshape(vals.size, -1).T)] = vals
        elif self.format == OrtSparseFormat.ORT_SPARSE_CSRC:
            rows = np.repeat(np.arange(self._shape[0]), np.diff(self._outer))
            dense[rows, self._inner] = vals
        else:
            raise RuntimeError(f"sparse format {self.format!r} is not supported")
        return dense
