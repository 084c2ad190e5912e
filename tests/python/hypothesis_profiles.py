"""The hypothesis settings every property test picks by HYPOTHESIS_PROFILE.

Each test file sizes its own profiles (a rule costs more in one machine than in
another) as {"dev": {...}, "ci": {...}, "long": {...}}; this module picks one the
same way everywhere: dev by default (what a developer's pytest runs), ci in
scripts/test.sh, long by hand. An unknown name is an error, not a silent default.

dev and ci are derandomized: the same examples every run, so CI is reproducible
and a failure there replays anywhere. To explore instead:

- ``explore``: ci's sizes with a fresh seed each run. conftest.py draws it,
  passes it to hypothesis as ``--hypothesis-seed`` and prints it in the header
  and at the end ("hypothesis: profile explore, seed N"); the same command with
  ``--hypothesis-seed=N`` replays that run. About CI's time.
- ``long``: each file's own longer sizes, random seeds, failures saved in
  ``.hypothesis/`` (docs/robustness.md).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

#: ci's sizes, a fresh seed each run (conftest.py draws and prints it).
EXPLORE = "explore"


def profile_settings(profiles: dict[str, dict[str, Any]], *suppress: HealthCheck) -> settings:
    """settings for HYPOTHESIS_PROFILE (default dev) out of `profiles`: no deadline,
    too_slow suppressed along with `suppress`. ValueError: a profile `profiles` lacks."""
    profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if profile == EXPLORE:
        chosen = {**profiles["ci"], "derandomize": False, "database": None}
    elif profile in profiles:
        chosen = profiles[profile]
    else:
        raise ValueError(f"HYPOTHESIS_PROFILE = {profile!r}: must be one of {sorted([*profiles, EXPLORE])}")
    return settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, *suppress], **chosen)
