"""Reading a config.json: the file (``load_hf_config``), its language model, and its fields with
the family's defaults (``Reader``).

The loader follows what transformers itself builds from the same file: the family's config
class fills fields the file leaves out (``kvcore.hf_config.families``), and each default used
is noted for the report. Anything contradictory is an error naming the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

from kvcore._errors import InvalidArgumentError
from kvcore.hf_config.families import FAMILIES, TEXT_MODEL_TYPE
from kvcore.hf_config.fields import optional_int

HFSource = Union[Mapping[str, Any], str, "os.PathLike[str]"]


def load_hf_config(source: HFSource) -> dict[str, Any]:
    """The config dict from a mapping, a config.json path, or a model directory."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidArgumentError(f"cannot read Hugging Face config {str(path)!r}: {e.strerror}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(
            f"{str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from e
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{str(path)!r}: a config.json must hold a JSON object, not {type(data).__name__}")
    return data


def language_model(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The dict that describes the language model, and its model_type."""
    model_type = raw.get("model_type")
    text = raw.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            raise InvalidArgumentError(f"text_config: must be an object, not {type(text).__name__}")
        for key in ("num_hidden_layers", "num_key_value_heads", "head_dim", "sliding_window", "layer_types"):
            if key in raw and key in text and raw[key] != text[key]:
                raise InvalidArgumentError(
                    f"{key}: the top level says {raw[key]!r}, text_config says {text[key]!r}"
                )
        if "num_hidden_layers" not in raw:
            inner = text.get("model_type")
            if inner is None and isinstance(model_type, str):
                inner = TEXT_MODEL_TYPE.get(model_type)
            return text, _model_type(inner)
    return raw, _model_type(model_type)


def _model_type(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"model_type = {value!r}: must be a string")
    return value


class Reader:
    """Reads fields of one config, filling the family's defaults and noting each one used."""

    def __init__(self, cfg: dict[str, Any], model_type: str) -> None:
        self.cfg = cfg
        self.model_type = model_type
        self.family = FAMILIES.get(model_type)
        self.defaults: list[str] = []

    def get(self, key: str) -> Any:
        """The field ``key``: the file's value, else the family's default (noted), else None."""
        if key in self.cfg:
            return self.cfg[key]
        if self.family is not None and key in self.family.defaults:
            return self.default(key, self.family.defaults[key])
        return None

    def default(self, key: str, value: Any) -> Any:
        """``value``, the family's default of ``key``, noted as used."""
        assert self.family is not None
        self.note(f"{key}={value!r} ({self.family.source} default)")
        return value

    def note(self, text: str) -> None:
        """Record a default the file left out, once however often it is read."""
        if text not in self.defaults:
            self.defaults.append(text)

    def optional_int(self, key: str, *, minimum: int = 1) -> Optional[int]:
        """The field ``key`` as an int >= ``minimum``, or None when neither the file nor the family has it."""
        return optional_int(self.get(key), key, minimum=minimum)

    def required_int(self, key: str) -> int:
        """The field ``key`` as an int >= 1; InvalidArgumentError naming it when it is missing."""
        value = self.optional_int(key)
        if value is None:
            raise InvalidArgumentError(
                f"{key}: missing, and model_type {self.model_type or '(missing)'!r} "
                "has no default kvcore knows"
            )
        return value


def head_dim_of(r: Reader, n_heads: Optional[int]) -> int:
    """The K/V head size: ``head_dim``, else ``hidden_size // num_attention_heads`` (always that for a
    family whose config class derives it); InvalidArgumentError when neither gives a whole number."""
    family = r.family
    if family is not None and family.derived_head_dim:
        hidden = r.optional_int("hidden_size")
        if hidden is None or n_heads is None or hidden % n_heads != 0:
            raise InvalidArgumentError(
                f"hidden_size = {hidden}, num_attention_heads = {n_heads}: {family.source} derives "
                "head_dim = hidden_size // num_attention_heads, which needs both, evenly divisible"
            )
        given = optional_int(r.cfg.get("head_dim"), "head_dim")
        if given is not None and given != hidden // n_heads:
            raise InvalidArgumentError(
                f"head_dim = {given}: contradicts hidden_size // num_attention_heads = "
                f"{hidden // n_heads}, which {family.source} always uses"
            )
        return hidden // n_heads
    given = r.optional_int("head_dim")
    if given is not None:
        return given
    hidden = r.optional_int("hidden_size")
    if hidden is None or n_heads is None or hidden % n_heads != 0:
        raise InvalidArgumentError(
            f"head_dim: missing, and hidden_size = {hidden} / num_attention_heads = {n_heads} "
            "cannot stand in for it (both needed, evenly divisible)"
        )
    return hidden // n_heads


__all__ = ["HFSource", "Reader", "head_dim_of", "language_model", "load_hf_config"]
