"""Which kind each layer of a config.json is: sliding windows, and the layer types of the families
with chunked, KV-shared, recurrent-state, empty and hybrid layers, derived as each family's
transformers config class derives them (``layer_types`` when the file has it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.hf_config.families import (
    CHUNKED,
    EMPTY_FAMILIES,
    EMPTY_TYPES,
    FAMILIES,
    FULL,
    HYBRID,
    HYBRID_FAMILIES,
    LAYER_TYPES_ALIAS,
    LEGACY_LAYER_TYPES,
    NEMOTRON_H_PATTERN,
    PER_LAYER_KV_FIELDS,
    SLIDING,
    STATE_TYPES,
)
from kvcore.hf_config.fields import optional_int, quoted_names
from kvcore.hf_config.reading import Reader
from kvcore.hf_config.shapes import ChunkedLayer, EmptyLayer, SharedLayer, SpecialLayer, StateShape
from kvcore.hf_config.state_shapes import state_shape

def layer_windows(r: Reader, n_layers: int) -> tuple[Optional[int], ...]:
    """Per layer: its sliding window, or None for full attention."""
    family = r.family
    if family is not None and family.pattern == "none":
        window: Optional[int] = None  # the config class has no sliding window at all
    else:
        use_sliding = r.get("use_sliding_window")
        if use_sliding is not None and not isinstance(use_sliding, bool):
            raise InvalidArgumentError(f"use_sliding_window = {use_sliding!r}: must be true or false")
        # use_sliding_window = false: transformers drops the window; the field only records its size.
        window = None if use_sliding is False else r.optional_int("sliding_window")

    every = optional_int(r.cfg.get("sliding_window_pattern"), "sliding_window_pattern")
    if every is not None and family is not None and family.pattern == "every" and family.every_field is None:
        if every != family.every:
            raise InvalidArgumentError(
                f"sliding_window_pattern = {every}: {family.source} always makes every "
                f"layer i with (i + 1) % {family.every} == 0 full"
            )

    kinds = r.cfg.get("layer_types")
    if kinds is not None:
        return _from_layer_types(kinds, window, every, n_layers)
    if window is None:
        return (None,) * n_layers
    if family is None:
        if every is not None:
            return _every(every, window, n_layers)
        if r.cfg.get("use_sliding_window") is True:
            return (window,) * n_layers
        raise InvalidArgumentError(
            f"sliding_window = {window}: model_type {r.model_type or '(missing)'!r} is not a family "
            "kvcore knows, so it cannot tell which layers slide; add layer_types (one "
            f"{SLIDING!r} or {FULL!r} per layer) or sliding_window_pattern"
        )
    if family.pattern == "all":
        return (window,) * n_layers
    if family.pattern == "qwen2":
        first = r.optional_int("max_window_layers", minimum=0)
        assert first is not None  # the family default supplies it
        return tuple(window if i >= first else None for i in range(n_layers))
    if every is None:
        every = family.every
        if family.every_field is not None:
            r.default(family.every_field, every)
    return _every(every, window, n_layers)


def has_special_layers(r: Reader) -> bool:
    """True when the config has chunked, KV-shared or recurrent-state layers (or a layer kind
    other than full and sliding), which special_layer_kinds reads."""
    family = r.family
    if family is not None and family.pattern == "kinds":
        return True
    if r.cfg.get("num_kv_shared_layers") not in (None, 0) or r.cfg.get("attention_chunk_size") is not None:
        return True
    kinds = r.cfg.get("layer_types")
    return isinstance(kinds, Sequence) and not isinstance(kinds, str) and any(k not in (FULL, SLIDING) for k in kinds)


def special_layer_kinds(
    r: Reader, n_layers: int
) -> tuple[tuple[Optional[int], ...], tuple[Optional[SpecialLayer], ...]]:
    """(windows, special) of a model with chunked, KV-shared, state or empty layers: per layer its
    sliding window (or None), and its ChunkedLayer / SharedLayer / StateShape / EmptyLayer (or None).
    A "hybrid" layer (Falcon-H1) is a full-attention layer at its index plus a state layer appended
    after the model's ``n_layers`` (index n_layers + k for the k-th), as kvcore's transformers cache
    (integrations.transformers_config.cache_config_for) builds it."""
    types = family_layer_types(r, n_layers)
    windows: list[Optional[int]] = []
    special: list[Optional[SpecialLayer]] = []
    state: Optional[StateShape] = None
    hybrids = 0
    for i, kind in enumerate(types):
        window: Optional[int] = None
        other: Optional[SpecialLayer] = None
        if kind == SLIDING:
            window = r.optional_int("sliding_window")
            if window is None:
                raise InvalidArgumentError(f"layer_types[{i}] = {SLIDING!r}: contradicts sliding_window, which is missing")
        elif kind == CHUNKED:
            chunk = r.optional_int("attention_chunk_size")
            if chunk is None:
                raise InvalidArgumentError(
                    f"layer_types[{i}] = {CHUNKED!r}: contradicts attention_chunk_size, which is missing"
                )
            other = ChunkedLayer(chunk)
        elif kind in STATE_TYPES:
            state = state or state_shape(r, kind, i)
            other = state
        elif kind in EMPTY_TYPES and r.model_type in EMPTY_FAMILIES:
            other = EmptyLayer(kind)
        elif kind == HYBRID and r.model_type in HYBRID_FAMILIES:
            state = state or state_shape(r, kind, i)  # its attention here, its state appended below
            hybrids += 1
        elif kind != FULL:
            raise NotSupportedError(
                f"layer_types[{i}] = {kind!r}: kvcore models only {FULL!r}, {SLIDING!r}, {CHUNKED!r} and the "
                f"recurrent {' and '.join(repr(t) for t in STATE_TYPES)} layers (and the "
                f"{' and '.join(repr(t) for t in EMPTY_TYPES)} layers of model_type {quoted_names(EMPTY_FAMILIES)}, "
                f"which cache nothing, and the {HYBRID!r} layers of model_type {quoted_names(HYBRID_FAMILIES)})"
            )
        windows.append(window)
        special.append(other)
    shared = r.optional_int("num_kv_shared_layers", minimum=0) or 0
    if shared:
        _share_kv(types, special, windows, shared)
    windows += [None] * hybrids
    special += [state] * hybrids
    return tuple(windows), tuple(special)


def family_layer_types(r: Reader, n_layers: int) -> list[str]:
    """Each layer's transformers layer type (what cache_utils.get_layer_types_and_kwargs reads, before
    it renames "mlp" and "moe" to "dummy"): layer_types when the file has it, else the family's rule.
    Bamba and Jamba always derive theirs (their config classes cannot load a file that sets them),
    Nemotron-H reads layers_block_type or hybrid_override_pattern."""
    mt = r.model_type
    if mt in ("bamba", "jamba"):
        return _derived_hybrid_types(r, n_layers)
    if mt == "nemotron_h":
        return nemotron_h_types(r)
    if mt == "falcon_h1":  # FalconH1Config.layers_block_type: every layer "hybrid", a read-only property
        if r.cfg.get("layer_types") is not None:
            raise InvalidArgumentError(
                f"layer_types = {r.cfg['layer_types']!r:.60}: transformers FalconH1Config makes every layer "
                f"{HYBRID!r} and cannot load a file that sets layer_types"
            )
        return [HYBRID] * n_layers
    kinds = _file_layer_types(r, n_layers)
    if kinds is not None:
        return kinds
    if mt == "llama4_text":  # Llama4TextConfig: layers with RoPE chunk, every no_rope_layer_interval-th is full
        chunk = r.optional_int("attention_chunk_size")
        rope = r.cfg.get("no_rope_layers")
        if not rope:
            every = r.optional_int("no_rope_layer_interval")
            assert every is not None  # the family default supplies it
            rope = [int((i + 1) % every != 0) for i in range(n_layers)]
        if not isinstance(rope, Sequence) or len(rope) != n_layers:
            raise InvalidArgumentError(f"no_rope_layers: must hold one 0 or 1 per layer ({n_layers})")
        return [CHUNKED if flag and chunk is not None else FULL for flag in rope]
    if mt == "gemma3n_text":  # Gemma3nTextConfig: every 5th layer full, the rest sliding
        return [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(n_layers)]
    if mt in ("qwen3_next", "qwen3_5_text"):
        # Qwen3NextConfig, Qwen3_5TextConfig: every full_attention_interval-th layer full, the rest linear.
        every = r.optional_int("full_attention_interval")
        assert every is not None
        return ["linear_attention" if (i + 1) % every else FULL for i in range(n_layers)]
    if mt == "lfm2":  # Lfm2Config: full_attn_idxs are full (default: every layer), the rest short convs
        idxs = r.cfg.get("full_attn_idxs")
        if idxs is None:
            idxs = list(range(n_layers))
            r.note("full_attn_idxs=every layer (transformers Lfm2Config default)")
        if not isinstance(idxs, Sequence) or not all(isinstance(i, int) and 0 <= i < n_layers for i in idxs):
            raise InvalidArgumentError(f"full_attn_idxs = {idxs!r:.60}: must be a list of layer indices")
        return [FULL if i in idxs else "conv" for i in range(n_layers)]
    if mt == "granitemoehybrid":  # GraniteMoeHybridConfig: every layer Mamba-2 by default
        r.note("layer_types=every layer 'linear_attention' (transformers GraniteMoeHybridConfig default)")
        return ["linear_attention"] * n_layers
    if r.cfg.get("attention_chunk_size") is not None:
        raise InvalidArgumentError(
            f"attention_chunk_size = {r.cfg['attention_chunk_size']!r}: model_type {mt or '(missing)'!r} is not a "
            f"family kvcore knows, so it cannot tell which layers are chunked; add layer_types"
        )
    return [FULL if w is None else SLIDING for w in layer_windows(r, n_layers)]


def _file_layer_types(r: Reader, n_layers: Optional[int]) -> Optional[list[str]]:
    """The file's layer_types (or the family's alias of it, e.g. Nemotron-H's layers_block_type), legacy
    names ("mamba", "attention") renamed as transformers renames them; None when the file has none.
    InvalidArgumentError for a malformed list, one of the wrong length (``n_layers``, when given), or an
    alias that contradicts layer_types."""
    found: list[tuple[str, list[str]]] = []
    alias = LAYER_TYPES_ALIAS.get(r.model_type)
    for key in ("layer_types", *((alias,) if alias else ())):
        kinds = r.cfg.get(key)
        if kinds is None:
            continue
        if not isinstance(kinds, Sequence) or isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
            raise InvalidArgumentError(f"{key}: must be a list of strings, not {kinds!r:.60}")
        if n_layers is not None and len(kinds) != n_layers:
            raise InvalidArgumentError(
                f"{key} has {len(kinds)} entries: must have one per layer, num_hidden_layers = {n_layers}"
            )
        found.append((key, [str(LEGACY_LAYER_TYPES.get(k, k)) for k in kinds]))
    if len(found) == 2 and found[0][1] != found[1][1]:
        raise InvalidArgumentError(f"{found[1][0]}: contradicts layer_types (transformers reads them as one field)")
    return found[0][1] if found else None


def _derived_hybrid_types(r: Reader, n_layers: int) -> list[str]:
    """Bamba's and Jamba's layer types as their transformers config classes derive them (the
    layers_block_type / layer_types properties): Bamba's attn_layer_indices are full attention,
    Jamba's layers with i % attn_layer_period == attn_layer_offset; every other layer Mamba. A file that
    lists layer_types or layers_block_type itself must agree (transformers cannot load it otherwise)."""
    if r.model_type == "bamba":
        idxs = r.cfg.get("attn_layer_indices")
        if "attn_layer_indices" not in r.cfg:
            r.note("attn_layer_indices=None, every layer Mamba-2 (transformers BambaConfig default)")
        if idxs is None:
            idxs = []
        if (not isinstance(idxs, Sequence) or isinstance(idxs, str)
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers for i in idxs)):
            raise InvalidArgumentError(
                f"attn_layer_indices = {idxs!r:.60}: must be a list of layer indices in [0, {n_layers})"
            )
        rule = f"attn_layer_indices = {list(idxs)!r:.60}"
        kinds = [FULL if i in idxs else "linear_attention" for i in range(n_layers)]
    else:
        period = r.optional_int("attn_layer_period")
        offset = r.optional_int("attn_layer_offset", minimum=0)
        assert period is not None and offset is not None  # the family defaults supply them
        if offset >= period:
            raise InvalidArgumentError(
                f"attn_layer_offset = {offset}: must be < attn_layer_period = {period} (transformers JambaConfig)"
            )
        rule = f"attn_layer_period = {period}, attn_layer_offset = {offset}"
        kinds = [FULL if i % period == offset else "linear_attention" for i in range(n_layers)]
    for key in ("layer_types", "layers_block_type"):
        listed = r.cfg.get(key)
        if listed is None:
            continue
        if not isinstance(listed, Sequence) or isinstance(listed, str) or not all(isinstance(k, str) for k in listed):
            raise InvalidArgumentError(f"{key}: must be a list of strings, not {listed!r:.60}")
        if [LEGACY_LAYER_TYPES.get(k, k) for k in listed] != kinds:
            family = FAMILIES[r.model_type].source
            raise InvalidArgumentError(
                f"{key} = {listed!r:.60}: contradicts {rule}, from which {family} derives the layer kinds"
            )
    return kinds


def nemotron_h_types(r: Reader) -> list[str]:
    """Nemotron-H's layer types as NemotronHConfig reads them: layers_block_type (or layer_types), else
    hybrid_override_pattern ("M" Mamba-2, "*" attention, "-" MLP, "E" MoE), else its default
    [linear_attention, moe, full_attention, mlp]. The number of layers is the list's length; a
    num_hidden_layers that says otherwise is an error (transformers would ignore it)."""
    kinds = _file_layer_types(r, None)
    pattern = r.cfg.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            raise InvalidArgumentError(f"hybrid_override_pattern = {pattern!r:.60}: must be a non-empty string")
        bad = next((i for i, c in enumerate(pattern) if c not in NEMOTRON_H_PATTERN), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"hybrid_override_pattern[{bad}] = {pattern[bad]!r}: must be one of 'M' (Mamba-2), '*' (attention), "
                "'-' (MLP) and 'E' (MoE)"
            )
        from_pattern = [NEMOTRON_H_PATTERN[c] for c in pattern]
        if kinds is not None and kinds != from_pattern:
            raise InvalidArgumentError(
                f"hybrid_override_pattern = {pattern!r:.60}: contradicts layers_block_type "
                "(transformers NemotronHConfig reads layers_block_type and ignores the pattern)"
            )
        kinds = from_pattern
    if kinds is None:
        kinds = ["linear_attention", "moe", FULL, "mlp"]
        r.note(f"layers_block_type={kinds!r} (transformers NemotronHConfig default)")
    if not kinds:
        raise InvalidArgumentError("layers_block_type: empty, a model needs at least one layer")
    given = r.optional_int("num_hidden_layers")
    if given is not None and given != len(kinds):
        raise InvalidArgumentError(
            f"num_hidden_layers = {given}: contradicts the layer list, which has {len(kinds)} layers "
            "(transformers NemotronHConfig takes the number of layers from it)"
        )
    return kinds


def _share_kv(types: list[str], special: list[Optional[SpecialLayer]], windows: list[Optional[int]],
              shared: int) -> None:
    """Make the last ``shared`` layers SharedLayer: each reads the last earlier non-shared layer of its
    own layer type (transformers Gemma3nTextConfig.kv_sharing_modes)."""
    n = len(types)
    if shared >= n:
        raise InvalidArgumentError(
            f"num_kv_shared_layers = {shared}: must be < num_hidden_layers = {n} (some layer must write K/V)"
        )
    first = n - shared
    for i in range(first, n):
        if isinstance(special[i], (StateShape, EmptyLayer)):
            what = "a recurrent" if isinstance(special[i], StateShape) else "an MLP-only"
            raise InvalidArgumentError(f"num_kv_shared_layers = {shared}: layer {i} is {what} layer, not attention")
        source = next((j for j in range(first - 1, -1, -1) if types[j] == types[i]), None)
        if source is None:
            raise InvalidArgumentError(
                f"num_kv_shared_layers = {shared}: layer {i} is {types[i]!r}, and no layer before {first} is, "
                "so it has no layer to share K/V with"
            )
        special[i] = SharedLayer(source)
        windows[i] = None


def _every(every: int, window: int, n_layers: int) -> tuple[Optional[int], ...]:
    # transformers: "sliding_attention" if (i + 1) % pattern else "full_attention".
    return tuple(None if (i + 1) % every == 0 else window for i in range(n_layers))


def _from_layer_types(
    kinds: Any, window: Optional[int], every: Optional[int], n_layers: int
) -> tuple[Optional[int], ...]:
    if not isinstance(kinds, Sequence) or isinstance(kinds, str):
        raise InvalidArgumentError(f"layer_types: must be a list of strings, not {type(kinds).__name__}")
    if len(kinds) != n_layers:
        raise InvalidArgumentError(
            f"layer_types has {len(kinds)} entries: must have one per layer, num_hidden_layers = {n_layers}"
        )
    out: list[Optional[int]] = []
    for i, kind in enumerate(kinds):
        if kind == FULL:
            out.append(None)
        elif kind == SLIDING:
            if window is None:
                raise InvalidArgumentError(
                    f"layer_types[{i}] = {SLIDING!r}: contradicts sliding_window, which is missing, "
                    "null or switched off by use_sliding_window = false"
                )
            out.append(window)
        else:
            raise NotSupportedError(
                f"layer_types[{i}] = {kind!r}: kvcore models only {FULL!r} and {SLIDING!r} layers"
            )
    if every is not None:
        expected = [None if (i + 1) % every == 0 else window for i in range(n_layers)]
        if out != expected:
            raise InvalidArgumentError(
                f"sliding_window_pattern = {every}: contradicts layer_types "
                f"(first difference at layer {next(i for i in range(n_layers) if out[i] != expected[i])})"
            )
    return tuple(out)


def per_layer_windows(
    per_layer: Any, windows: tuple[Optional[int], ...]
) -> tuple[Optional[int], ...]:
    """Apply ``per_layer_config``: a sparse {layer index: overrides} map (transformers'
    heterogeneous configs). A sliding layer's ``sliding_window`` override is its
    window; an override of a K/V shape field is not modelled."""
    if per_layer is None:
        return windows
    if not isinstance(per_layer, Mapping):
        raise InvalidArgumentError(
            f"per_layer_config: must be an object mapping layer indices to overrides, not {type(per_layer).__name__}"
        )
    out = list(windows)
    for key, overrides in per_layer.items():
        try:
            i = int(key)
        except (TypeError, ValueError):
            i = -1
        if not 0 <= i < len(out) or isinstance(key, bool):
            raise InvalidArgumentError(
                f"per_layer_config key {key!r}: must be a layer index in [0, num_hidden_layers = {len(out)})"
            )
        if not isinstance(overrides, Mapping):
            raise InvalidArgumentError(f"per_layer_config[{key!r}]: must be an object, not {type(overrides).__name__}")
        for field_name in PER_LAYER_KV_FIELDS:
            if field_name in overrides and (field_name != "skip" or overrides[field_name]):
                raise NotSupportedError(
                    f"per_layer_config[{key!r}].{field_name} = {overrides[field_name]!r}: layers with their own "
                    "K/V shape are not modelled"
                )
        if "sliding_window" in overrides and out[i] is not None:  # a full layer stays full, as in transformers
            window = optional_int(overrides["sliding_window"], f"per_layer_config[{key!r}].sliding_window")
            if window is None:
                raise InvalidArgumentError(
                    f"per_layer_config[{key!r}].sliding_window = None: contradicts layer {i}, which slides"
                )
            out[i] = window
    return tuple(out)


__all__ = [
    "family_layer_types", "has_special_layers", "layer_windows", "nemotron_h_types", "per_layer_windows",
    "special_layer_kinds",
]  # fmt: skip
