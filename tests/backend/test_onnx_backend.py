"""Every ONNX backend test case of the installed onnx package, run through onnxpy.

Cases listed in ``tests/backend/exclusions/*.txt`` (one ``name  # reason`` per line) are skipped with their
reason; everything else must match onnx's expected outputs within the case's tolerances.
"""

import warnings

import pytest

from onnxpy.testing.conformance import collect_cases, load_exclusions, run_case

_CASES = collect_cases()
_EXCLUDED = load_exclusions()


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_backend_case(case):
    if case.name in _EXCLUDED:
        pytest.skip(f"excluded: {_EXCLUDED[case.name]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_case(case)


def test_case_count():
    # node + model + file cases of onnx 1.23.2; a different onnx may ship a different number
    assert len(_CASES) >= 2000


def test_exclusions_name_real_cases():
    names = {c.name for c in _CASES}
    stale = sorted(set(_EXCLUDED) - names)
    assert not stale, f"exclusions name cases that do not exist: {stale[:10]}"
