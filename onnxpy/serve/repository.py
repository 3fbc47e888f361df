"""Served models: loading (single files or a Triton-layout repository), metadata and request validation."""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .protocol import ProtocolError, numpy_dtype, onnx_type_to_v2, to_model_input, v2_shape

PLATFORM = "onnxruntime_onnx"  # what Triton reports for ONNX models; clients key on it


@dataclass
class TensorSpec:
    name: str
    datatype: str          # v2 datatype, e.g. FP32
    shape: list[int]       # v2 shape, -1 for dynamic dims
    onnx_type: str         # e.g. tensor(float)


@dataclass
class ServedModel:
    """One version of one model, with its (thread-safe) session."""

    name: str
    version: str
    path: str | None
    session: object
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int = 0      # >0: dynamic batching on (first dim is the batch dim)
    max_queue_delay_s: float = 0.0
    load_time_s: float = 0.0

    @classmethod
    def load(cls, name: str, version: str, source, *, sess_options=None, max_batch_size: int = 0,
             max_queue_delay_ms: float = 0.0) -> ServedModel:
        from .. import InferenceSession

        t0 = time.perf_counter()
        sess = InferenceSession(source, sess_options=sess_options)
        m = cls(name=name, version=str(version), path=source if isinstance(source, str) else None, session=sess)
        for kind, args in (("input", sess.get_inputs()), ("output", sess.get_outputs())):
            specs = m.inputs if kind == "input" else m.outputs
            for a in args:
                try:
                    dt = onnx_type_to_v2(a.type)
                except ValueError as e:
                    raise ValueError(f"model '{name}' {kind} '{a.name}': {e}") from None
                specs.append(TensorSpec(a.name, dt, v2_shape(a.shape), a.type))
        m.load_time_s = time.perf_counter() - t0
        if max_batch_size and max_batch_size > 1 and m.batchable:
            m.max_batch_size = int(max_batch_size)
            m.max_queue_delay_s = max(0.0, float(max_queue_delay_ms)) / 1000.0
        return m

    # -- batching ------------------------------------------------------------------------------------------
    @property
    def batchable(self) -> bool:
        """Every input and output has a dynamic first dim (taken to be the batch dim)."""
        return bool(self.inputs) and all(len(t.shape) >= 1 and t.shape[0] == -1 for t in self.inputs + self.outputs)

    # -- protocol views ------------------------------------------------------------------------------------
    def metadata(self, versions: list[str]) -> dict:
        return {
            "name": self.name,
            "versions": versions,
            "platform": PLATFORM,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in self.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in self.outputs],
        }

    def config(self) -> dict:
        """Triton-style model configuration (``GET /v2/models/<name>/config``)."""
        b = self.max_batch_size

        def io(t):
            return {"name": t.name, "data_type": "TYPE_" + ("STRING" if t.datatype == "BYTES" else t.datatype),
                    "dims": t.shape[1:] if b else t.shape}

        cfg = {"name": self.name, "platform": PLATFORM, "backend": "onnxpy", "max_batch_size": b,
               "input": [io(t) for t in self.inputs], "output": [io(t) for t in self.outputs],
               "version_policy": {"all": {}}}
        if b:
            cfg["dynamic_batching"] = {"max_queue_delay_microseconds": int(self.max_queue_delay_s * 1e6)}
        return cfg

    # -- requests ------------------------------------------------------------------------------------------
    def validate(self, feeds: dict, types: dict) -> tuple[dict, int | None]:
        """Check names, datatypes and shapes against the model; returns (session feeds, batch size or None)."""
        known = {t.name: t for t in self.inputs}
        for n in feeds:
            if n not in known:
                raise ProtocolError(f"model '{self.name}' has no input '{n}' (inputs: {sorted(known)})")
        out = {}
        for t in self.inputs:
            if t.name not in feeds:
                raise ProtocolError(f"model '{self.name}' expects input '{t.name}'")
            arr = feeds[t.name]
            if types[t.name] != t.datatype:
                raise ProtocolError(f"input '{t.name}': datatype {types[t.name]}, model expects {t.datatype}")
            if len(arr.shape) != len(t.shape) or any(e != -1 and e != d for e, d in zip(t.shape, arr.shape)):
                raise ProtocolError(f"input '{t.name}': shape {list(arr.shape)}, model expects {t.shape} "
                                    f"(-1 = any)")
            out[t.name] = to_model_input(arr, t.datatype)
        batch = None
        if self.max_batch_size:
            firsts = {a.shape[0] for a in out.values()}
            if len(firsts) == 1:
                batch = firsts.pop()
        return out, batch

    def output_names(self, requested: list[dict] | None, default_binary: bool) -> list[tuple[str, bool]]:
        """Requested outputs (all when none) as (name, binary?) pairs."""
        names = [t.name for t in self.outputs]
        if not requested:
            return [(n, default_binary) for n in names]
        res = []
        for o in requested:
            n = o["name"]
            if n not in names:
                raise ProtocolError(f"model '{self.name}' has no output '{n}' (outputs: {names})")
            p = o.get("parameters") or {}
            if not isinstance(p, dict):
                raise ProtocolError(f"output '{n}': 'parameters' must be an object")
            if "shared_memory_region" in p:
                raise ProtocolError(f"output '{n}': shared memory is not supported")
            if "classification" in p:
                raise ProtocolError(f"output '{n}': the classification extension is not supported")
            res.append((n, bool(p.get("binary_data", default_binary))))
        return res

    def run(self, output_names, feeds) -> list:
        return self.session.run(output_names, feeds)


_VERSION_RE = re.compile(r"^[0-9]+$")


class ModelRepository:
    """Models by name, each with one or more integer versions; an unversioned request gets the newest."""

    def __init__(self):
        self._models: dict[str, dict[str, ServedModel]] = {}
        self._lock = threading.Lock()

    def add(self, model: ServedModel):
        with self._lock:
            vers = self._models.setdefault(model.name, {})
            if model.version in vers:
                raise ValueError(f"model '{model.name}' version {model.version} is given twice")
            vers[model.version] = model

    def names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, name: str) -> list[str]:
        return sorted(self._models.get(name, {}), key=lambda v: int(v) if v.isdigit() else -1)

    def all(self) -> list[ServedModel]:
        return [self._models[n][v] for n in self.names() for v in self.versions(n)]

    def get(self, name: str, version: str | None = None) -> ServedModel:
        vers = self._models.get(name)
        if not vers:
            raise ProtocolError(f"unknown model '{name}' (serving: {self.names()})", status=404)
        if version in (None, ""):
            return vers[self.versions(name)[-1]]
        if version not in vers:
            raise ProtocolError(f"model '{name}' has no version '{version}' (versions: {self.versions(name)})",
                                status=404)
        return vers[version]

    # -- loading -------------------------------------------------------------------------------------------
    @classmethod
    def from_specs(cls, specs, model_repository: str | None = None, **load_kw) -> ModelRepository:
        """``specs``: model files as ``PATH`` or ``NAME=PATH`` (version 1); plus a Triton-layout directory."""
        repo = cls()
        for spec in specs or []:
            name, path = spec.split("=", 1) if "=" in spec and not os.path.exists(spec) else (None, spec)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"model file not found: {path}")
            if name is None:
                name = os.path.splitext(os.path.basename(path))[0]
            repo.add(ServedModel.load(name, "1", path, **load_kw))
        if model_repository:
            repo.load_directory(model_repository, **load_kw)
        if not repo.names():
            raise ValueError("no models to serve: give model files or --model-repository DIR")
        return repo

    def load_directory(self, root: str, **load_kw):
        """Triton layout: ``ROOT/<name>/<version>/model.onnx`` (or the only ``*.onnx`` in the version folder)."""
        if not os.path.isdir(root):
            raise FileNotFoundError(f"model repository not found: {root}")
        for name in sorted(os.listdir(root)):
            mdir = os.path.join(root, name)
            if not os.path.isdir(mdir) or name.startswith("."):
                continue
            found = False
            for ver in sorted(os.listdir(mdir)):
                vdir = os.path.join(mdir, ver)
                if not (_VERSION_RE.match(ver) and os.path.isdir(vdir)):
                    continue
                path = os.path.join(vdir, "model.onnx")
                if not os.path.isfile(path):
                    cands = [f for f in os.listdir(vdir) if f.endswith(".onnx")]
                    if len(cands) != 1:
                        raise ValueError(f"{vdir}: expected model.onnx (or exactly one .onnx file)")
                    path = os.path.join(vdir, cands[0])
                self.add(ServedModel.load(name, str(int(ver)), path, **load_kw))
                found = True
            if not found:
                raise ValueError(f"{mdir}: no numeric version folders (layout: <name>/<version>/model.onnx)")


def concat_feeds(items: list[dict]) -> dict:
    return {k: np.concatenate([f[k] for f in items], axis=0) for k in items[0]}


def feeds_signature(feeds: dict) -> tuple:
    """Requests with equal signatures can be concatenated along the batch dim."""
    return tuple(sorted((k, str(v.dtype), v.shape[1:]) for k, v in feeds.items()))


__all__ = ["ModelRepository", "ServedModel", "TensorSpec", "concat_feeds", "feeds_signature", "numpy_dtype"]
