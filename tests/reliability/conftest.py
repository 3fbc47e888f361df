"""Reliability tests: ``@pytest.mark.slow`` variants run only with ``-m slow`` or ONNXPY_RUN_SLOW=1."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.getoption("-m") or "") or os.environ.get("ONNXPY_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow reliability variant: run with -m slow or ONNXPY_RUN_SLOW=1")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if "slow" in item.keywords and str(item.path).startswith(here):
            item.add_marker(skip)
