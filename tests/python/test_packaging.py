"""kvcore as its users get it: the C++ consumer (tests/consumer) built against the
installed wheel, a `cmake --install` and add_subdirectory; the paths the package
reports; the metadata and the sdist; a missing optional dependency that names
the extra to install.

The C++ builds need cmake and a C++ compiler (and use ninja when there is one);
without them those tests skip. The wheel tests need kvcore imported from an
installed wheel (scripts/test.sh installs it); a staged build (scripts/dev.sh,
the sanitizer run) skips them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from needs import need

import kvcore
from kvcore import cli

ROOT = Path(__file__).resolve().parents[2]
CONSUMER = ROOT / "tests" / "consumer"
SOURCE_CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "cpp" / "include" / "kvcore" / "kvcore.h").is_file()
# Imported from site-packages (a wheel pip installed), not from a staged build or a checkout.
INSTALLED = Path(kvcore.__file__).parent.parent.name in ("site-packages", "dist-packages")
needs_wheel = pytest.mark.skipif(not INSTALLED, reason=f"kvcore is imported from {Path(kvcore.__file__).parent}, "
                                                       "not from an installed wheel")
needs_checkout = pytest.mark.skipif(not SOURCE_CHECKOUT, reason=f"no kvcore source checkout at {ROOT}")


def headers_under(include_dir: Path) -> set[str]:
    return {p.relative_to(include_dir).as_posix() for p in (include_dir / "kvcore").rglob("*.h")}


# --- C++ builds ----------------------------------------------------------------


class CMake:
    """Runs cmake with the host's C++ compiler; every failure shows its output."""

    def __init__(self, cmake: str, cxx: str) -> None:
        self.cmake, self.cxx = cmake, cxx
        self.generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        # The sanitizer run preloads ASan into the interpreter; the build tools need not carry it.
        self.env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if check and done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def configure(self, source: Path, build: Path, *defines: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(self.cmake, "-S", source, "-B", build, *self.generator,
                        f"-DCMAKE_CXX_COMPILER={self.cxx}", *defines, check=check)

    def consumer(self, build: Path, *defines: str) -> str:
        """Configures, builds and runs tests/consumer; returns the configure output."""
        configured = self.configure(CONSUMER, build, *defines)
        self.run(self.cmake, "--build", build)
        ran = self.run(build / "kvcore_consumer")
        assert ran.stdout == "kvcore consumer: one step of 3 tokens committed\n"
        return configured.stdout


@pytest.fixture(scope="module")
def cmake() -> CMake:
    exe = shutil.which("cmake")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if exe is None:
        pytest.skip("no cmake to build the C++ consumer with")
    if cxx is None:
        pytest.skip("no C++ compiler to build the C++ consumer with")
    return CMake(exe, cxx)


@needs_wheel
@pytest.mark.parametrize("how", ["kvcore_DIR", "CMAKE_PREFIX_PATH"])
def test_consumer_finds_the_installed_wheel(cmake: CMake, how: str, tmp_path: Path) -> None:
    cmake_dir = Path(kvcore.get_cmake_dir())
    site = cmake_dir.parents[3]  # <site-packages>/kvcore/share/cmake/kvcore
    define = f"-Dkvcore_DIR={cmake_dir}" if how == "kvcore_DIR" else f"-DCMAKE_PREFIX_PATH={site}"
    out = cmake.consumer(tmp_path / "build", define)
    assert f"kvcore_consumer: kvcore {kvcore.__version__} from {cmake_dir}" in out


@needs_checkout
def test_consumer_finds_a_cmake_install(cmake: CMake, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    cmake.configure(ROOT, tmp_path / "kvcore", "-DKVCORE_BUILD_TESTS=OFF", "-DKVCORE_BUILD_BENCH=OFF")
    cmake.run(cmake.cmake, "--install", tmp_path / "kvcore", "--prefix", prefix)
    # GNUInstallDirs locations (lib/ or lib64/, whichever the platform uses); every header, subfolders too.
    configs = list(prefix.glob("lib*/cmake/kvcore/kvcoreConfig.cmake"))
    assert len(configs) == 1, list(prefix.rglob("*"))
    assert headers_under(prefix / "include") == headers_under(ROOT / "cpp" / "include")
    out = cmake.consumer(tmp_path / "build", f"-DCMAKE_PREFIX_PATH={prefix}")
    assert f"from {configs[0].parent}" in out

    # The version file: SameMinorVersion, so the next minor release is refused.
    major, minor, _ = kvcore.__version__.split(".")
    refused = cmake.configure(CONSUMER, tmp_path / "refused", f"-DCMAKE_PREFIX_PATH={prefix}",
                              f"-DKVCORE_CONSUMER_VERSION={major}.{int(minor) + 1}", check=False)
    assert refused.returncode != 0
    assert "compatible with requested version" in " ".join(refused.stderr.split())  # CMake wraps lines


@needs_checkout
def test_consumer_through_add_subdirectory(cmake: CMake, tmp_path: Path) -> None:
    build = tmp_path / "build"
    cmake.consumer(build, "-DKVCORE_CONSUMER_ADD_SUBDIRECTORY=ON", f"-DKVCORE_CONSUMER_SOURCE_DIR={ROOT}")
    cache = (build / "CMakeCache.txt").read_text()
    # Not the top-level project: no tests (so no GoogleTest needed), no install rules.
    assert "KVCORE_BUILD_TESTS:BOOL=OFF" in cache
    assert "KVCORE_INSTALL:BOOL=OFF" in cache


@needs_checkout
def test_top_level_configure_without_gtest_skips_the_tests(cmake: CMake, tmp_path: Path) -> None:
    no_gtest = ["-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON", "-DKVCORE_BUILD_BENCH=OFF"]
    done = cmake.configure(ROOT, tmp_path / "skip", *no_gtest)
    assert "skipping the C++ tests" in done.stderr and "libgtest-dev" in done.stderr
    assert "KVCORE_BUILD_TESTS:BOOL=ON" in (tmp_path / "skip" / "CMakeCache.txt").read_text()  # top level: on

    required = cmake.configure(ROOT, tmp_path / "required", *no_gtest, "-DKVCORE_REQUIRE_TESTS=ON", check=False)
    assert required.returncode != 0
    assert "C++ tests required but unavailable" in required.stderr and "libgtest-dev" in required.stderr


# --- paths the package reports ---------------------------------------------------


def test_get_include_holds_the_headers() -> None:
    include = Path(kvcore.get_include())
    assert (include / "kvcore" / "kvcore.h").is_file()
    if SOURCE_CHECKOUT:  # the whole tree, subfolders too (an older install: reinstall kvcore)
        assert headers_under(include) >= headers_under(ROOT / "cpp" / "include")


@needs_wheel
def test_get_cmake_dir_holds_the_package() -> None:
    cmake_dir = Path(kvcore.get_cmake_dir())
    assert cmake_dir == Path(kvcore.__file__).parent / "share" / "cmake" / "kvcore"
    for name in ("kvcoreConfig.cmake", "kvcoreConfigVersion.cmake", "kvcoreTargets.cmake"):
        assert (cmake_dir / name).is_file(), name
    # The exported target points into the wheel's own include directory.
    assert "${_IMPORT_PREFIX}/kvcore/include" in (cmake_dir / "kvcoreTargets.cmake").read_text()


def python_m_kvcore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcore", *args], capture_output=True, text=True)


def test_python_m_kvcore_includes() -> None:
    done = python_m_kvcore("--includes")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"-I{kvcore.get_include()}\n", "")


@needs_wheel
def test_python_m_kvcore_cmakedir() -> None:
    done = python_m_kvcore("--cmakedir")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{kvcore.get_cmake_dir()}\n", "")


def test_cmakedir_without_a_package_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(kvcore, "get_cmake_dir", lambda: str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        cli.main(["--cmakedir"])
    assert exited.value.code == 1
    out, err = capsys.readouterr()
    assert out == "" and f"no kvcoreConfig.cmake in {tmp_path}" in err


# --- metadata and sdist ----------------------------------------------------------


@needs_wheel
def test_installed_metadata() -> None:
    meta = importlib.metadata.metadata("kvcore")
    assert meta["License"] == "Apache-2.0"
    classifiers = set(meta.get_all("Classifier") or [])
    assert {
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: C++",
        "Typing :: Typed",
        *(f"Programming Language :: Python :: 3.{minor}" for minor in range(9, 14)),
    } <= classifiers
    # Every extra an error message names is declared.
    assert {"bfloat16", "plot", "transformers", "distributed", "gemma", "test"} <= set(meta.get_all("Provides-Extra") or [])
    files = [f.as_posix() for f in importlib.metadata.files("kvcore") or []]
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files), files
    # Subpackages ship: the demos (kvcore demo) and the integrations.
    for module in ("kvcore_demo/__init__.py", "kvcore_demo/model.py", "kvcore/integrations/__init__.py"):
        assert module in files, module


@needs_checkout
def test_sdist_contents(tmp_path: Path) -> None:
    need("scikit_build_core", reason="building the sdist needs scikit-build-core")
    build = "import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", build, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    name = done.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        top = name[: -len(".tar.gz")]
        members = {m.name[len(top) + 1:] for m in sdist.getmembers() if m.isfile()}
        pkg_info = sdist.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        metadata = pkg_info.read().decode()
    for needed in ("cpp/include/kvcore/kvcore.h", "LICENSE", "pyproject.toml", "CMakeLists.txt",
                   "cmake/kvcoreConfig.cmake.in", "python/kvcore/__init__.py", "python/kvcore/py.typed",
                   "python/kvcore_demo/__init__.py", "python/kvcore_demo/model.py"):
        assert needed in members, needed
    assert not [m for m in members if m.startswith(("tests/fuzz/corpus/", "tests/fuzz/batch_corpus/", "build/", ".ci/"))]
    assert re.search(r"^License: Apache-2.0$", metadata, flags=re.M)
    assert re.search(r"^Provides-Extra: bfloat16$", metadata, flags=re.M)


# --- the package's layout -----------------------------------------------------------


PACKAGE = Path(kvcore.__file__).resolve().parent


def test_the_top_level_is_the_api() -> None:
    """Beside the API sit only the command line, the memory planner and its command, the export command, the sequence records
    (kvcore.state), the host tier (the kvcore.tier package), the cluster store and router on Ray (kvcore.cluster), the
    quantized formats' names and sizes (kvcore.quantized), the step of one
    forward (kvcore.forward_step) and the config.json reader (the kvcore.hf_config package); the
    torch byte layers are kvcore.torch, adapters to other libraries kvcore.integrations; the demos
    and the reference model they run are a package of their own beside it, kvcore_demo (kvcore.demo
    is its deprecated path); `import kvcore` loads none of them."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == [
        "__init__", "__main__", "_argparse", "_errors", "_paths", "cli",
        "export_command", "forward_step", "memory", "memory_command", "quantized", "registry", "state",
    ]  # fmt: skip
    assert sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")) == [
        "cluster", "demo", "hf_config", "integrations", "tier", "torch"]
    assert not [name for name in kvcore.__all__ if "demo" in name.lower() or name in ("model", "Model", "Decoder")]
    probe = ("import sys, kvcore; print(sorted(m for m in sys.modules"
             " if m.startswith(('kvcore_demo', 'kvcore.demo', 'kvcore.torch'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "[]\n", done.stdout + done.stderr


def test_the_demo_package_names_its_modules() -> None:
    doc = importlib.import_module("kvcore_demo").__doc__ or ""
    demo = Path(importlib.import_module("kvcore_demo").__file__ or "").parent
    assert demo.name == "kvcore_demo" and len(list(demo.glob("[!_]*.py"))) > 10
    for path in sorted(demo.glob("[!_]*.py")):
        assert f"``kvcore_demo.{path.stem}``" in doc, path.stem


def test_the_cluster_package_names_its_modules() -> None:
    doc = importlib.import_module("kvcore.cluster").__doc__ or ""
    modules = sorted((PACKAGE / "cluster").glob("[!_]*.py"))
    assert len(modules) >= 4
    for path in modules:
        assert f"``kvcore.cluster.{path.stem}``" in doc, path.stem


def test_the_tier_package_names_its_modules() -> None:
    doc = importlib.import_module("kvcore.tier").__doc__ or ""
    modules = sorted((PACKAGE / "tier").glob("[!_]*.py"))
    assert len(modules) >= 4
    for path in modules:
        assert f"``kvcore.tier.{path.stem}``" in doc, path.stem


def test_the_torch_package_names_its_modules() -> None:
    doc = importlib.import_module("kvcore.torch").__doc__ or ""
    for path in sorted((PACKAGE / "torch").glob("[!_]*.py")):
        assert f"``{path.stem}``" in doc or f"``kvcore.torch.{path.stem}``" in doc, path.stem


def test_the_hf_config_package_names_its_modules() -> None:
    doc = importlib.import_module("kvcore.hf_config").__doc__ or ""
    for path in sorted((PACKAGE / "hf_config").glob("[!_]*.py")):
        assert f"``kvcore.hf_config.{path.stem}``" in doc, path.stem


def test_the_integrations_package_names_its_modules() -> None:
    # Was: two of its four modules.
    doc = importlib.import_module("kvcore.integrations").__doc__ or ""
    modules = sorted((PACKAGE / "integrations").glob("[!_]*.py"))
    assert len(modules) >= 4
    for path in modules:
        assert f"``kvcore.integrations.{path.stem}``" in doc, path.stem


# --- a missing optional dependency names the extra -------------------------------


@pytest.mark.parametrize("missing", ["torch", "transformers", "packaging"])
def test_transformers_integration_without_its_dependencies(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    # Import now raises ModuleNotFoundError, submodules too (an imported one would be found directly).
    for name in [missing, *(m for m in sys.modules if m.startswith(missing + "."))]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("kvcore.integrations.transformers", "kvcore.torch.pool"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install "kvcore[transformers]"')) as raised:
        importlib.import_module("kvcore.integrations.transformers")
    assert raised.value.name is not None  # torch is imported first: named when it is absent too
    assert raised.value.name.split(".")[0] in ("torch", "transformers", "packaging")


def test_demo_bfloat16_without_ml_dtypes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    assert cli.main(["demo", "--layers", "2", "--dtype", "bfloat16"]) == 2
    assert 'needs the ml_dtypes package: pip install "kvcore[bfloat16]"' in capsys.readouterr().err


def test_memory_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["memory", "--model", "gemma-3-1b", "--plot", str(tmp_path / "kv.png")]) == 1
    assert 'pip install "kvcore[plot]"' in capsys.readouterr().err
