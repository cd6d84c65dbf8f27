"""pytest configuration: hypothesis profiles and the import path of the package.

Profiles: "ci" (the default: 25 examples per test, derandomized, so a CI run is
repeatable) and "deep" (300 random examples, HYPOTHESIS_PROFILE=deep), which explores.
"""
import os
import sys
import warnings

import pytest
from hypothesis import HealthCheck, settings

# Run from a checkout without installing: make `import tracejit` find the package.
_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_TESTS))
# The suite's helper modules (graph_builder, variant_dump) sit here, beside the test
# folders; test files import them as top-level modules. The folders have no __init__.py,
# so pytest imports each test file by its basename: basenames are unique across folders
# (tests/test_suite_layout.py checks it).
if _TESTS not in sys.path:
    sys.path.insert(1, _TESTS)

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def jit_warnings_are_errors():
    """An unexpected fallback fails the test (files opt in with pytestmark)."""
    import tracejit as tj
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JitWarning)
        yield


@pytest.fixture
def record_jit_warnings():
    """The JitWarnings a test's calls raise, recorded (for tests that expect a fallback)."""
    import tracejit as tj
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", tj.JitWarning)
        yield seen


@pytest.fixture(scope="module")
def kernel_cache_dir(tmp_path_factory):
    """A fresh TRACEJIT_CACHE_DIR for the tests of one module."""
    d = str(tmp_path_factory.mktemp("kcache"))
    old = os.environ.get("TRACEJIT_CACHE_DIR")
    os.environ["TRACEJIT_CACHE_DIR"] = d
    yield d
    if old is None:
        os.environ.pop("TRACEJIT_CACHE_DIR", None)
    else:
        os.environ["TRACEJIT_CACHE_DIR"] = old


_DUMP_DIR = os.environ.get("TRACEJIT_DUMP_VARIANTS")
if _DUMP_DIR:
    # Test-only: see tests/variant_dump.py (checks a restructuring changed no output).
    from variant_dump import install as _install_dump, write as _write_dump
    _install_dump()

    @pytest.fixture(autouse=True)
    def _dump_generated_code(request):
        yield
        _write_dump(_DUMP_DIR, request.node.nodeid)
