"""The transformers releases kvcore's integrations accept: the one version gate.

``kvcore.integrations.transformers`` (``KVCoreCache``) relies on transformers'
public Cache API and accepts 5.x from 5.24; ``kvcore.integrations.hf_batch``
(continuous batching) replaces private internals that change between minor
releases and accepts the tested minor release only. Each checks the range and
then that the calls it relies on are there, with ``check_release``.
"""

from __future__ import annotations

from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from kvcore._errors import NotSupportedError

TESTED = "5.24.0"
CACHE_SUPPORTED = ">=5.24,<6"
BATCHING_SUPPORTED = ">=5.24,<5.25"


def check_release(version: str, supported: str, user: str, why: str, needed: Callable[[], dict[str, bool]]) -> None:
    """Raise NotSupportedError unless transformers ``version`` (its base release: a pre-release of
    5.24.0 counts as 5.24.0) is in ``supported`` and every call ``needed()`` names exists.
    ``user`` names the integration in the message, ``why`` says why other releases are refused."""
    if not SpecifierSet(supported).contains(Version(Version(version).base_version)):
        raise NotSupportedError(
            f"{user} needs transformers {supported} (tested with {TESTED}); found {version}. {why}"
        )
    missing = [name for name, ok in needed().items() if not ok]
    if missing:
        raise NotSupportedError(
            f"transformers {version} lacks {', '.join(missing)}, which {user} relies on (tested with {TESTED})"
        )


__all__ = ["BATCHING_SUPPORTED", "CACHE_SUPPORTED", "TESTED", "check_release"]
