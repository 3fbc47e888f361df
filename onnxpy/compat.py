"""Make ``import onnxruntime`` (and its submodules) resolve to onnxpy, so existing applications run unchanged.

    import onnxpy.compat; onnxpy.compat.install()     # in code, before anything imports onnxruntime
    python -m onnxpy.compat app.py [args...]           # run a script with onnxruntime mapped to onnxpy
    python -m onnxpy.compat -m package.module [args]   # same for a module

``onnxruntime.X.Y`` maps to ``onnxpy.X.Y`` when onnxpy has that module; a missing one raises ImportError
naming both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import runpy
import sys

ALIAS = "onnxruntime"
TARGET = "onnxpy"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target_name: str):
        self.target_name = target_name

    def create_module(self, spec):
        return importlib.import_module(self.target_name)

    def exec_module(self, module):
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        target_name = TARGET + fullname[len(ALIAS):]
        if importlib.util.find_spec(target_name) is None:
            raise ImportError(f"{fullname}: onnxpy has no module {target_name}")
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name))


_finder = _AliasFinder()


def install() -> None:
    """Route ``onnxruntime`` imports to onnxpy (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in [m for m in sys.modules if m == ALIAS or m.startswith(ALIAS + ".")]:
        if not getattr(sys.modules[name], "__name__", "").startswith(TARGET):
            del sys.modules[name]


def uninstall() -> None:
    """Undo :func:`install` (modules already imported under the alias stay aliased until removed)."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in [m for m in sys.modules if m == ALIAS or m.startswith(ALIAS + ".")]:
        del sys.modules[name]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("python -m onnxpy.compat -m MODULE [args]", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
