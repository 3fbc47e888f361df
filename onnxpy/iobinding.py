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

    def bind_cpu_input(self, name, arr_on_cpu):
        self._inputs[name] = np.asarray(arr_on_cpu) if not isinstance(arr_on_cpu, np.ndarray) else arr_on_cpu

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        _check_device(device_type)
        dt = _element_type(element_type)
        count = int(np.prod(shape)) if len(shape) else 1
        buf = (np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (count * dt.itemsize)).from_address(buffer_ptr)))
        self._inputs[name] = buf.view(dt).reshape(tuple(shape))

    def bind_ortvalue_input(self, name, ortvalue):
        self._inputs[name] = ortvalue._value

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None, buffer_ptr=None):
        _check_device(device_type)
        if buffer_ptr is not None:
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

    def get_outputs(self):
        return list(self._results)

    def get_outputs_as_ortvaluevector(self):
        return list(self._results)

    def copy_outputs_to_cpu(self):
        return [r._value for r in self._results]

    def _run(self, run_options=None):
        names = list(self._outputs) or None
        outs = self._session._state.run(names, self._inputs, run_options)
        results = []
        for name, val in zip(names or [o.name for o in self._session.get_outputs()], outs):
            pre = self._outputs.get(name) if names else None
            if pre is not None and isinstance(val, np.ndarray):
                dst = pre._value
                if dst.shape != val.shape:
                    raise RuntimeError(
                        f"Output '{name}': bound buffer has shape {list(dst.shape)}, the result has "
                        f"{list(val.shape)}"
                    )
                np.copyto(dst, val, casting="unsafe")
                results.append(pre)
            else:
                results.append(OrtValue(val))
        self._results = results


__all__ = ["IOBinding", "dtypes"]
