"""Logging with onnxruntime's severity levels.

onnxpy logs through the standard :mod:`logging` module under the ``onnxpy`` logger hierarchy (``onnxpy.optimizer``,
``onnxpy.plan``, ``onnxpy.session``, ``onnxpy.custom_ops``...).  This module maps that onto onnxruntime's model:

* severities ``0`` VERBOSE, ``1`` INFO, ``2`` WARNING, ``3`` ERROR, ``4`` FATAL
  (Python ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``, ``CRITICAL``);
* a process default severity (``onnxpy.set_default_logger_severity``, default 2: warnings and worse);
* per session ``SessionOptions.log_severity_level`` / ``logid`` and per run ``RunOptions.log_severity_level`` /
  ``logid`` (``-1``: inherit), applied to the messages emitted while that session is created or run;
* :func:`set_default_logger_callback` sends every message that passes the severity filter to
  ``callback(severity, category, logid, code_location, message)`` (the arguments of onnxruntime's
  ``OrtLoggingFunction``) instead of stderr.

Without a callback, messages are printed to stderr in onnxruntime's format
(``2024-05-01 10:00:00.123 [W:onnxpy:Default, passes.py:42 apply] ...``), unless the application has
configured Python logging (the root logger has handlers), in which case they only go there.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable

VERBOSE, INFO, WARNING, ERROR, FATAL = 0, 1, 2, 3, 4
SEVERITY_NAMES = ("VERBOSE", "INFO", "WARNING", "ERROR", "FATAL")
_LETTER = "VIWEF"
_TO_PY = {VERBOSE: logging.DEBUG, INFO: logging.INFO, WARNING: logging.WARNING, ERROR: logging.ERROR,
          FATAL: logging.CRITICAL}

ROOT_LOGGER = "onnxpy"
log = logging.getLogger("onnxpy.session")

__all__ = [
    "VERBOSE", "INFO", "WARNING", "ERROR", "FATAL", "SEVERITY_NAMES", "set_default_logger_callback",
    "get_default_logger_callback", "set_default_logger_severity", "get_default_logger_severity", "severity_of",
    "to_python_level", "session_scope", "scope_for", "check_config_entries", "register_config_keys",
    "effective_severity", "get_logger",
]


def _check_severity(severity, what="severity") -> int:
    try:
        s = int(severity)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an int 0 (VERBOSE) .. 4 (FATAL), got {severity!r}") from None
    if not VERBOSE <= s <= FATAL:
        raise ValueError(f"{what} must be 0 (VERBOSE) .. 4 (FATAL), got {s}")
    return s


def to_python_level(severity: int) -> int:
    """onnxruntime severity -> :mod:`logging` level."""
    return _TO_PY[_check_severity(severity)]


def severity_of(levelno: int) -> int:
    """:mod:`logging` level -> onnxruntime severity (levels between two map to the lower severity)."""
    if levelno >= logging.CRITICAL:
        return FATAL
    if levelno >= logging.ERROR:
        return ERROR
    if levelno >= logging.WARNING:
        return WARNING
    if levelno >= logging.INFO:
        return INFO
    return VERBOSE


def get_logger(name: str = "") -> logging.Logger:
    """A logger under ``onnxpy`` (``get_logger("optimizer")`` is ``logging.getLogger("onnxpy.optimizer")``)."""
    return logging.getLogger(f"{ROOT_LOGGER}.{name}" if name else ROOT_LOGGER)


# -- process-wide state ---------------------------------------------------------------------------------------

_state_lock = threading.Lock()
_callback: Callable | None = None
_callback_severity: int = WARNING
_active: Counter = Counter()  # severities requested by scopes in progress (all threads)
_local = threading.local()


def get_default_logger_severity() -> int:
    """The process default severity (kept in ``onnxpy._logger_severity`` so both setters agree)."""
    mod = sys.modules.get("onnxpy")
    sev = getattr(mod, "_logger_severity", WARNING) if mod is not None else WARNING
    try:
        return int(sev)
    except (TypeError, ValueError):
        return WARNING


def set_default_logger_severity(severity: int) -> None:
    """Messages below ``severity`` are dropped unless a session or run asks for more (onnxruntime's API)."""
    s = _check_severity(severity)
    mod = sys.modules.get("onnxpy")
    if mod is not None:
        mod._logger_severity = s
    _sync_level()


def set_default_logger_callback(callback: Callable | None, severity: int = WARNING) -> None:
    """Send onnxpy's log messages to ``callback(severity, category, logid, code_location, message)``.

    ``severity`` also becomes the default logger severity (like creating onnxruntime's environment with a
    custom logger).  ``None`` restores printing to stderr.  Exceptions raised by the callback are swallowed
    (logging must never break inference).
    """
    global _callback, _callback_severity
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    s = _check_severity(severity)
    with _state_lock:
        _callback = callback
        _callback_severity = s
    set_default_logger_severity(s)


def get_default_logger_callback() -> Callable | None:
    return _callback


def _stack() -> list:
    st = getattr(_local, "stack", None)
    if st is None:
        st = _local.stack = []
    return st


def effective_severity() -> int:
    """The severity threshold on this thread: the innermost session/run scope's, else the default."""
    for sev, _logid in reversed(_stack()):
        if sev >= 0:
            return sev
    return get_default_logger_severity()


def _current_logid() -> str:
    for _sev, logid in reversed(_stack()):
        if logid:
            return logid
    return ""


def _sync_level() -> None:
    """Let records through the ``onnxpy`` logger down to the lowest severity anyone currently wants."""
    with _state_lock:
        lowest = min([get_default_logger_severity(), *(s for s, c in _active.items() if c > 0)])
    logging.getLogger(ROOT_LOGGER).setLevel(_TO_PY[max(VERBOSE, min(FATAL, lowest))])


class _Handler(logging.Handler):
    """Filters by the thread's effective severity and dispatches to the callback or stderr."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)

    def emit(self, record: logging.LogRecord) -> None:
        sev = severity_of(record.levelno)
        if sev < effective_severity():
            return
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not break a run
            message = str(record.msg)
        logid = _current_logid()
        location = f"{record.filename}:{record.lineno} {record.funcName}"
        cb = _callback
        if cb is not None:
            try:
                cb(sev, record.name, logid, location, message)
            except Exception:  # noqa: BLE001 - logging must never break inference
                pass
            return
        if logging.getLogger().handlers:
            return  # the application configured logging: the record propagates there
        stamp = datetime.datetime.fromtimestamp(record.created).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        try:
            sys.stderr.write(f"{stamp} [{_LETTER[sev]}:onnxpy:{logid or 'Default'}, {location}] {message}\n")
        except Exception:  # noqa: BLE001
            pass


_handler = None


def _install() -> None:
    global _handler
    with _state_lock:
        if _handler is not None:
            return
        _handler = _Handler()
        logging.getLogger(ROOT_LOGGER).addHandler(_handler)
    _sync_level()


_install()


# -- session / run scopes -------------------------------------------------------------------------------------

@contextlib.contextmanager
def session_scope(sess_options=None, run_options=None, check_config: bool = False):
    """Apply a session's (and optionally a run's) ``log_severity_level``/``logid`` to messages emitted inside.

    ``check_config=True`` (at session creation) also reports unknown or unsupported config entries.
    """
    sev, logid = -1, ""
    if sess_options is not None:
        sev = _option_severity(sess_options, "SessionOptions")
        logid = str(getattr(sess_options, "logid", "") or "")
    if run_options is not None:
        rs = _option_severity(run_options, "RunOptions")
        if rs >= 0:
            sev = rs
        logid = str(getattr(run_options, "logid", "") or "") or logid
    st = _stack()
    st.append((sev, logid))
    if sev >= 0:
        with _state_lock:
            _active[sev] += 1
        _sync_level()
    try:
        if check_config and sess_options is not None:
            check_config_entries(sess_options)
        yield
    finally:
        st.pop()
        if sev >= 0:
            with _state_lock:
                _active[sev] -= 1
                if _active[sev] <= 0:
                    del _active[sev]
            _sync_level()


_NULL = contextlib.nullcontext()


def scope_for(sess_options=None, run_options=None):
    """:func:`session_scope` when a severity or logid is set, else a shared no-op context (cheap per run)."""
    for o in (sess_options, run_options):
        if o is not None and (getattr(o, "log_severity_level", -1) not in (-1, None) or getattr(o, "logid", "")):
            return session_scope(sess_options, run_options)
    return _NULL


def _option_severity(opts, what: str) -> int:
    sev = getattr(opts, "log_severity_level", -1)
    if sev is None or int(sev) == -1:
        return -1
    return _check_severity(sev, f"{what}.log_severity_level")


# -- config entries -------------------------------------------------------------------------------------------

# Keys onnxpy acts on.
SUPPORTED_CONFIG_KEYS = {
    "optimization.disable_specified_optimizers",
    "optimization.constant_folding_max_output_size_in_bytes",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.max_tensor_bytes",
    "session.max_loop_iterations",
    "session.disable_prepacking",
}

# onnxruntime keys that are accepted and have no effect here (native threading, allocators, EPs, ORT format).
IGNORED_ORT_CONFIG_KEYS = {
    "session.use_env_allocators", "session.load_model_format",
    "session.save_model_format", "session.set_denormal_as_zero", "session.disable_quant_qdq",
    "session.disable_double_qdq_remover", "session.enable_quant_qdq_cleanup", "session.disable_aot_function_inlining",
    "optimization.enable_gelu_approximation", "optimization.enable_cast_chain_elimination",
    "optimization.minimal_build_optimizations", "session.use_device_allocator_for_initializers",
    "session.inter_op.allow_spinning", "session.intra_op.allow_spinning", "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers", "session.qdqisint8allowed", "session.x64quantprecision",
    "session.minimal_build_optimizations", "session.disable_cpu_ep_fallback",
    "session.model_external_initializers_file_folder_path", "session.save_external_prepacked_constant_initializers",
    "session.collect_node_memory_stats_to_file", "session.resource_cuda_partitioning_settings",
    "session.intra_op_thread_affinities", "session.debug_layout_transformation", "session.dynamic_block_base",
    "session.force_spinning_stop", "session.strict_shape_type_inference", "session.allow_released_opsets_only",
    "session.node_partition_config_file", "session.record_ep_graph_assignment_info",
    "session.graph_optimizations_loop_level", "session.disable_model_compile", "session.qdq_matmulnbits_accuracy_level",
    "session.use_lut_gemm", "mlas.enable_gemm_fastmath_arm64_bfloat16", "mlas.use_lut_gemm",
    "ep.context_enable", "ep.context_file_path", "ep.context_embed_mode", "ep.context_node_name_prefix",
    "ep.share_ep_contexts", "ep.stop_share_ep_contexts", "ep.context_model_external_initializers_file_name",
    "session.disable_synchronize_execution_providers",
}

_extra_keys: set = set()


def register_config_keys(*keys: str) -> None:
    """Declare more config keys as supported (for modules that read their own entries)."""
    _extra_keys.update(str(k) for k in keys)


def check_config_entries(sess_options) -> list[tuple[int, str]]:
    """Log (and return) one message per session config entry onnxpy does not act on.

    Keys under ``onnxpy.`` and keys declared with :func:`register_config_keys` are onnxpy's own.
    onnxruntime keys without an effect here are reported at INFO; unknown keys at WARNING (onnxruntime itself
    silently stores unknown keys, which hides typos).
    """
    config = getattr(sess_options, "_config", None) or {}
    out = []
    for key in config:
        if key in SUPPORTED_CONFIG_KEYS or key in _extra_keys or key.startswith("onnxpy."):
            continue
        if key in IGNORED_ORT_CONFIG_KEYS:
            msg = f"session config entry '{key}' is an onnxruntime setting with no effect in onnxpy (ignored)"
            out.append((INFO, msg))
            log.info(msg)
        else:
            msg = f"unknown session config entry '{key}' (ignored; check the spelling)"
            out.append((WARNING, msg))
            log.warning(msg)
    return out
