"""IOBinding on CPU: bind inputs and (optionally preallocated) outputs, run, read outputs as OrtValues."""

from __future__ import annotations

import numpy as np

from . import dtypes
from .ortvalue import OrtValue, _check_device, _element_type


class IOBinding:
    def __init__(self, session):
        self._session = session
        self._inputs: dict[str, object] = {}
        self._outputs: dict[str, OrtValue | None] = {}
        self._results: list[OrtValue] = []
        self._prev: dict[str, OrtValue] = {}

    def _check_input_name(self, name):
        if name not in self._session._state.feed_specs:
            raise RuntimeError(f"Failed to find NodeArg with name: {name} in the def list")

    def bind_cpu_input(self, name, arr_on_cpu):
        self._check_input_name(name)
        self._inputs[name] = np.asarray(arr_on_cpu) if not isinstance(arr_on_cpu, np.ndarray) else arr_on_cpu

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        self._check_input_name(name)
        _check_device(device_type)
        dt = _element_type(element_type)
        count = int(np.prod(shape)) if len(shape) else 1
        buf = (np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (count * dt.itemsize)).from_address(buffer_ptr)))
        self._inputs[name] = buf.view(dt).reshape(tuple(shape))

    def bind_ortvalue_input(self, name, ortvalue):
        self._check_input_name(name)
        self._inputs[name] = ortvalue._value

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None, buffer_ptr=None):
        if buffer_ptr is not None:
            _check_device(device_type)  # without a buffer, onnxruntime's CPU build also accepts any device name
            dt = _element_type(element_type)
            count = int(np.prod(shape)) if len(shape) else 1
            raw = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (count * dt.itemsize)).from_address(buffer_ptr))
            self._outputs[name] = OrtValue(raw.view(dt).reshape(tuple(shape)))
        else:
            self._outputs[name] = None

    def bind_ortvalue_output(self, name, ortvalue):
        self._outputs[name] = ortvalue

    def synchronize_inputs(self):
        pass

    def synchronize_outputs(self):
        pass

    def clear_binding_inputs(self):
        self._inputs.clear()

    def clear_binding_outputs(self):
        self._outputs.clear()
        self._results = []
        self._prev = {}

    def get_outputs(self):
        return list(self._results)

    def get_outputs_as_ortvaluevector(self):
        return list(self._results)

    def copy_outputs_to_cpu(self):
        # copies, like onnxruntime: a later run must not change arrays already handed out
        return [r._value.copy() if isinstance(r._value, np.ndarray) else r._value for r in self._results]

    def _run(self, run_options=None):
        names = list(self._outputs)
        try:
            if not names:
                raise RuntimeError("At least one output should be requested.")
            outs = self._session._state.run(names, self._inputs, run_options)
        except Exception as e:  # noqa: BLE001 - onnxruntime reports every IOBinding run failure this way
            msg = str(e)
            if msg.startswith("[ONNXRuntimeError] : "):
                msg = msg.split(" : ", 3)[-1]
            if msg.startswith("Invalid output name:"):
                msg = "Invalid output name: " + msg[len("Invalid output name:"):]
            raise RuntimeError(f"Error in execution: {msg}") from e
        results = []
        for name, val in zip(names, outs):
            pre = self._outputs.get(name)
            if pre is not None and isinstance(val, np.ndarray):
                dst = pre._value
                if dst.shape != val.shape:
                    raise RuntimeError(
                        f"Error in execution: The output OrtValue provided for output '{name}' has shape "
                        f"{{{','.join(map(str, dst.shape))}}} but the computed output shape for this run is "
                        f"{{{','.join(map(str, val.shape))}}}."
                    )
                np.copyto(dst, val, casting="unsafe")
                results.append(pre)
            elif (name in self._prev and isinstance(val, np.ndarray) and isinstance(self._prev[name]._value, np.ndarray)
                  and self._prev[name]._value.shape == val.shape and self._prev[name]._value.dtype == val.dtype):
                # like onnxruntime, an output bound without a buffer reuses the OrtValue the previous run returned
                prev = self._prev[name]
                np.copyto(prev._value, val)
                results.append(prev)
            else:
                results.append(OrtValue(val))
        self._results = results
        self._prev = {n: r for n, r in zip(names, results) if self._outputs.get(n) is None}


__all__ = ["IOBinding", "dtypes"]
