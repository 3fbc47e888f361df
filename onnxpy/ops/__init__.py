"""Kernel families.  Importing this package imports every module in it, which registers its kernels."""

import importlib
import pkgutil
import warnings

_loaded = False
load_errors: dict = {}  # module name -> exception text, for modules that failed to import


def load_all() -> None:
    """Import every op-family module once (each registers its kernels with ``registry.kernel``).

    A module that fails to import is recorded in ``load_errors`` and reported with a warning, so one broken
    family does not take the whole runtime down; the test suite asserts ``load_errors`` is empty.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "registry":
            continue
        try:
            importlib.import_module(f"{__name__}.{info.name}")
        except Exception as e:  # noqa: BLE001 - recorded and surfaced, see docstring
            load_errors[info.name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"onnxpy: op module '{info.name}' failed to import: {e}", RuntimeWarning, stacklevel=2)
