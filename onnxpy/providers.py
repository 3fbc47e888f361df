"""Execution providers: names, availability, and normalising the ``providers`` argument like onnxruntime."""

from __future__ import annotations

import warnings

ALL_PROVIDERS = [
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
    "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
    "DmlExecutionProvider", "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider",
    "XnnpackExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider", "CPUExecutionProvider",
]
AVAILABLE = ["CPUExecutionProvider"]


def get_all_providers() -> list[str]:
    return list(ALL_PROVIDERS)


def get_available_providers() -> list[str]:
    return list(AVAILABLE)


def resolve_providers(providers=None, provider_options=None) -> tuple[list[str], list[dict]]:
    """Normalise ``providers``/``provider_options`` to parallel lists of available providers and options."""
    if providers is None:
        return list(AVAILABLE), [{} for _ in AVAILABLE]
    names, opts = [], []
    has_tuples = any(isinstance(p, (tuple, list)) for p in providers)
    if has_tuples and provider_options is not None:
        raise ValueError("'providers' and 'provider_options' should not be used together")
    if provider_options is not None and len(provider_options) != len(providers):
        raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
    for i, p in enumerate(providers):
        if isinstance(p, (tuple, list)):
            if len(p) != 2 or not isinstance(p[1], dict):
                raise ValueError("Each provider tuple must be (name, options_dict)")
            name, o = p[0], p[1]
        else:
            name, o = p, (provider_options[i] if provider_options is not None else {})
        if not isinstance(name, str):
            raise ValueError(f"Provider names must be strings, got {type(name).__name__}")
        if name in names:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", UserWarning, stacklevel=3)
            continue
        if name not in AVAILABLE:
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names."
                f"Available providers: '{', '.join(AVAILABLE)}'",
                UserWarning, stacklevel=3,
            )
            continue
        names.append(name)
        opts.append({str(k): str(v) for k, v in o.items()})
    if not names:
        names, opts = ["CPUExecutionProvider"], [{}]
    return names, opts
