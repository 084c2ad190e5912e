"""The hypothesis settings every property test picks by HYPOTHESIS_PROFILE.

Each test file sizes its own profiles (a rule costs more in one machine than in
another) as {"dev": {...}, "ci": {...}, "long": {...}}; this module picks one the
same way everywhere: dev by default (what a developer's pytest runs), ci in
scripts/test.sh, long by hand. An unknown name is an error, not a silent default.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings


def profile_settings(profiles: dict[str, dict[str, Any]], *suppress: HealthCheck) -> settings:
    """settings for HYPOTHESIS_PROFILE (default dev) out of `profiles`: no deadline,
    too_slow suppressed along with `suppress`. ValueError: a profile `profiles` lacks."""
    profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if profile not in profiles:
        raise ValueError(f"HYPOTHESIS_PROFILE = {profile!r}: must be one of {sorted(profiles)}")
    return settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, *suppress], **profiles[profile])
