"""Where the C++ headers and the CMake package of this kvcore are, for C++ builds.

The wheel carries both inside the package (as pybind11's does):
``kvcore/include/kvcore/*.h`` and ``kvcore/share/cmake/kvcore/kvcoreConfig.cmake``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).parent


def get_include() -> str:
    """The directory to put on a C++ include path (``-I``) for ``#include "kvcore/kvcore.h"``.

    In an installed wheel it is ``<site-packages>/kvcore/include``. When kvcore
    runs from a source checkout instead (a build staged by ``scripts/dev.sh``,
    whose files link into one), the checkout's ``cpp/include`` is returned.
    Raises nothing: when neither holds ``kvcore/kvcore.h`` the wheel's path is
    returned all the same, so check for the header if you need to know.
    """
    installed = _PACKAGE / "include"
    if (installed / "kvcore" / "kvcore.h").is_file():
        return str(installed)
    source = Path(__file__).resolve().parents[2] / "cpp" / "include"
    if (source / "kvcore" / "kvcore.h").is_file():
        return str(source)
    return str(installed)


def get_cmake_dir() -> str:
    """The directory of kvcore's CMake package (``kvcoreConfig.cmake``).

    Pass it as ``-Dkvcore_DIR=...`` (or put it on ``CMAKE_PREFIX_PATH``) and
    ``find_package(kvcore CONFIG)`` gives the target ``kvcore::kvcore``. In an
    installed wheel it is ``<site-packages>/kvcore/share/cmake/kvcore``.
    Raises nothing: the path is returned even when it holds no package, as when
    kvcore runs from a source checkout (use ``add_subdirectory`` there); check
    for ``kvcoreConfig.cmake`` in it if you need to know.
    """
    return str(_PACKAGE / "share" / "cmake" / "kvcore")
