"""SessionOptions, RunOptions and the enums, with onnxruntime's attributes, defaults and values."""

from __future__ import annotations

import enum


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
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
        self._custom_ops: dict = {}

    def __setattr__(self, name, value):
        if name == "graph_optimization_level":
            try:
                value = GraphOptimizationLevel(int(value))
            except ValueError:
                raise RuntimeError("graph_optimization_level is not valid") from None
        elif name == "execution_mode":
            value = ExecutionMode(int(value))
        elif name == "execution_order":
            value = ExecutionOrder(int(value))
        object.__setattr__(self, name, value)

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self._free_dims_by_name[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        self._free_dims_by_denotation[str(dim_denotation)] = int(dim_value)

    def add_initializer(self, name: str, val) -> None:
        from .ortvalue import OrtValue

        if not isinstance(val, OrtValue):
            raise TypeError("add_initializer(): the value must be an OrtValue")
        self._initializers[str(name)] = val

    def add_external_initializers(self, names, values) -> None:
        if len(names) != len(values):
            raise ValueError("add_external_initializers(): names and values must have the same length")
        for n, v in zip(names, values):
            self.add_initializer(n, v)

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
        self.training_mode = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}")
        return self._config[key]
