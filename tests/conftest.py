"""pytest configuration: hypothesis profiles and the import path of the package.

Profiles: "ci" (the default: 25 examples per test, derandomized, so a CI run is
repeatable) and "deep" (300 random examples, HYPOTHESIS_PROFILE=deep), which explores.
"""
import os
import sys

from hypothesis import HealthCheck, settings

# Run from a checkout without installing: make `import tracejit` find the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
