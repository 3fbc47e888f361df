"""onnxruntime-compatible InferenceSession: load -> optimize -> plan -> run."""

from __future__ import annotations

import os
import threading

import numpy as np

from .execution.memory import release_heap as _release_heap
from .options import SessionOptions
from .ortvalue import OrtValue
from .providers import resolve_providers


class InferenceSession:
    """Drop-in for ``onnxruntime.InferenceSession``."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
        if not isinstance(path_or_bytes, (str, os.PathLike, bytes, bytearray, memoryview)) and not hasattr(
                path_or_bytes, "SerializeToString"):  # bytearray/memoryview/ModelProto: onnxpy extras
            raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
        self._model_path = path_or_bytes if isinstance(path_or_bytes, (str, os.PathLike)) else None
        # like onnxruntime, the session keeps its own copy: later changes to ``sess_options`` do not reach it
        self._sess_options = sess_options._clone() if sess_options is not None else SessionOptions()
        self._providers, self._provider_options = resolve_providers(providers, provider_options)
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._create(path_or_bytes)

    # -- construction -----------------------------------------------------------------------------
    def __del__(self):
        # Drop the model's arrays first, then hand the arena's free memory back (see execution/memory.py); a
        # finalizer on the state itself would run before its arrays are freed.
        state = self.__dict__.pop("_state", None)
        for name in ("_model", "_plan", "_inputs", "_overridable"):
            self.__dict__.pop(name, None)
        if state is not None and getattr(state, "heap_tuned", False):
            del state
            _release_heap()

    def _create(self, path_or_bytes):
        from .session_build import build_session_state

        self._state = build_session_state(path_or_bytes, self._sess_options, self._providers, self._kwargs)
        self._model = self._state.model
        self._plan = self._state.plan
        self._inputs = self._state.inputs
        self._overridable = self._state.overridable

    # -- metadata ---------------------------------------------------------------------------------
    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._state.outputs)

    def get_overridable_initializers(self):
        return list(self._overridable)

    def get_modelmeta(self):
        return self._state.meta

    def get_providers(self):
        return list(self._providers)

    def get_provider_options(self):
        # onnxruntime reports the options each provider applied; the CPU provider has none to report
        return {p: ({} if p == "CPUExecutionProvider" else dict(o)) for p, o in zip(self._providers,
                                                                                  self._provider_options)}

    def get_session_options(self):
        return self._sess_options

    def set_providers(self, providers=None, provider_options=None):
        self._providers, self._provider_options = resolve_providers(providers, provider_options)
        self._create(self._state.source)

    def enable_fallback(self):
        self._kwargs["enable_fallback"] = 1

    def disable_fallback(self):
        self._kwargs["enable_fallback"] = 0

    def end_profiling(self):
        prof = self._state.profiler
        return prof.end() if prof is not None else ""

    def get_profiling_start_time_ns(self):
        prof = self._state.profiler
        return prof.start_ns if prof is not None else 0

    # -- running ----------------------------------------------------------------------------------
    def run(self, output_names, input_feed, run_options=None):
        return self._state.run(output_names, input_feed, run_options)

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        feeds = {}
        for k, v in input_dict_ort_values.items():
            if not isinstance(v, OrtValue):
                name = "numpy.ndarray" if type(v) is np.ndarray else type(v).__name__
                raise AttributeError(f"'{name}' object has no attribute '_get_c_value'")
            feeds[k] = v._value
        outs = self._state.run(output_names, feeds, run_options)
        return [OrtValue(o) for o in outs]

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        self._state.check_missing(input_feed)

        def work():
            try:
                res = self._state.run(output_names, input_feed, run_options)
            except Exception as e:  # noqa: BLE001 - reported through the callback like onnxruntime
                msg = str(e)
                for prefix in ("[ONNXRuntimeError] : ",):
                    if msg.startswith(prefix):
                        msg = msg.split(" : ", 3)[-1]
                callback([], user_data, msg)
                return
            callback(res, user_data, "")

        threading.Thread(target=work, daemon=True).start()

    def io_binding(self):
        from .iobinding import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options=None):
        if iobinding._session is not self:
            raise ValueError("IOBinding must be used with the session that created it.")
        iobinding._run(run_options)


__all__ = ["InferenceSession"]
