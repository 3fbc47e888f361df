"""SessionOptions, RunOptions and the enums, with onnxruntime's attributes, defaults and values."""

from __future__ import annotations

import enum


class _OrtEnum(enum.IntEnum):
    """An IntEnum whose ``str()`` is ``ClassName.MEMBER`` like onnxruntime's pybind11 enums."""

    def __str__(self):
        return f"{type(self).__name__}.{self.name}"

    __format__ = int.__format__


class GraphOptimizationLevel(_OrtEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(_OrtEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(_OrtEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class SessionOptions:
    """Configuration for an InferenceSession (same attribute names and defaults as onnxruntime)."""

    def __init__(self):
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.optimized_model_filepath = ""
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_cpu_mem_arena = True
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}
        self._free_dims_by_name: dict[str, int] = {}
        self._free_dims_by_denotation: dict[str, int] = {}
        self._initializers: dict = {}
        self._external_names: set = set()
        self._custom_ops: dict = {}

    def __setattr__(self, name, value):
        object.__setattr__(self, name, _check_attr(self, _SESSION_ATTRS, name, value))

    def _clone(self) -> SessionOptions:
        """A copy with its own config/override/initializer tables (what a session keeps, like onnxruntime)."""
        c = SessionOptions.__new__(SessionOptions)
        for k, v in self.__dict__.items():
            object.__setattr__(c, k, type(v)(v) if isinstance(v, (dict, set)) else v)
        return c

    def add_session_config_entry(self, key: str, value: str) -> None:
        _check_str_args("add_session_config_entry", key, value)
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self._free_dims_by_name[_check_str_args("add_free_dimension_override_by_name", dim_name)] = _as_int(
            "add_free_dimension_override_by_name", dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        self._free_dims_by_denotation[_check_str_args("add_free_dimension_override_by_denotation", dim_denotation)] = (
            _as_int("add_free_dimension_override_by_denotation", dim_value))

    def add_initializer(self, name: str, val) -> None:
        from .ortvalue import OrtValue

        if not isinstance(val, OrtValue):
            # onnxruntime: RuntimeError "... The provided Python object must be an OrtValue"
            raise RuntimeError(f"add_initializer('{name}'): The provided Python object must be an OrtValue")
        self._initializers[str(name)] = val

    def add_external_initializers(self, names, values) -> None:
        from .ortvalue import OrtValue

        for v in values:
            if not isinstance(v, OrtValue):
                raise AttributeError(f"'{_tp_name(v)}' object has no attribute '_ortvalue'")
        if len(names) != len(values):
            raise RuntimeError("Expecting names and ort_values lists to have equal length")
        for n, v in zip(names, values):
            self.add_initializer(n, v)
            self._external_names.add(str(n))

    def register_custom_op(self, domain: str, op_type: str, fn, since: int = 1) -> None:
        """Register a Python callable as the kernel for ``(domain, op_type)`` in sessions using these options."""
        self._custom_ops[("" if domain == "ai.onnx" else domain, op_type)] = fn

    def register_custom_ops_library(self, path: str) -> None:
        raise RuntimeError(
            f"onnxpy cannot load native custom-op libraries ('{path}'); register Python functions with "
            "SessionOptions.register_custom_op instead"
        )


class RunOptions:
    """Per-run settings (same members as onnxruntime.RunOptions)."""

    def __init__(self):
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self.training_mode = False  # onnxpy extra (onnxruntime training builds have it)
        self._config: dict[str, str] = {}

    def __setattr__(self, name, value):
        object.__setattr__(self, name, _check_attr(self, _RUN_ATTRS, name, value))

    def add_run_config_entry(self, key: str, value: str) -> None:
        _check_str_args("add_run_config_entry", key, value)
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}")
        return self._config[key]


# -- attribute typing like onnxruntime's pybind11 properties --------------------------------------------------
# Types: "int" (an integer, bool and float refused), "bool" (bool or integer, coerced), "str", or an enum class
# (a member, or an int naming one: onnxpy also accepts the int where onnxruntime asks for the enum member).
_SESSION_ATTRS = {
    "graph_optimization_level": GraphOptimizationLevel, "optimized_model_filepath": "str",
    "intra_op_num_threads": "int", "inter_op_num_threads": "int", "execution_mode": ExecutionMode,
    "execution_order": ExecutionOrder, "enable_profiling": "bool", "profile_file_prefix": "str",
    "enable_mem_pattern": "bool", "enable_mem_reuse": "bool", "enable_cpu_mem_arena": "bool",
    "log_severity_level": "int", "log_verbosity_level": "int", "logid": "str", "use_deterministic_compute": "bool",
    "use_per_session_threads": "bool",
}
_RUN_ATTRS = {
    "log_severity_level": "int", "log_verbosity_level": "int", "logid": "str", "terminate": "bool",
    "only_execute_path_to_fetches": "bool", "training_mode": "bool",
}


def _tp_name(v) -> str:
    t = type(v)
    return t.__name__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__.split('.')[0]}.{t.__name__}"


def _incompatible(owner, name, kind, value) -> TypeError:
    want = kind.__name__ if isinstance(kind, type) else {"int": "typing.SupportsInt", "bool": "bool"}.get(kind, kind)
    return TypeError(
        "(): incompatible function arguments. The following argument types are supported:\n"
        f"    1. (arg0: {type(owner).__name__}, arg1: {want}) -> None\n\nInvoked with: {name}={value!r}"
    )


def _is_int(v) -> bool:
    import numpy as np

    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_attr(owner, table, name, value):
    if name.startswith("_"):
        return value
    kind = table.get(name)
    if kind is None:
        raise AttributeError(f"'onnxpy.{type(owner).__name__}' object has no attribute '{name}'")
    if isinstance(kind, type):
        if isinstance(value, kind):
            return value
        if _is_int(value):
            try:
                return kind(int(value))
            except ValueError:
                pass
        raise _incompatible(owner, name, kind, value)
    if kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "int":
        if _is_int(value):
            return int(value)
    elif kind == "bool":
        import numpy as np

        if isinstance(value, (bool, np.bool_)) or _is_int(value):
            return bool(value)
    raise _incompatible(owner, name, kind, value)


def _check_str_args(func, *args):
    for a in args:
        if not isinstance(a, str):
            raise TypeError(f"{func}(): incompatible function arguments. The following argument types are supported:"
                            f"\n    1. ({', '.join('arg: str' for _ in args)}) -> None\n\nInvoked with: {args!r}")
    return args[0]


def _as_int(func, v) -> int:
    if not _is_int(v):
        raise TypeError(f"{func}(): incompatible function arguments. The following argument types are supported:"
                        f"\n    1. (arg0: str, arg1: typing.SupportsInt) -> None\n\nInvoked with: {v!r}")
    return int(v)
