"""Read a Hugging Face ``config.json`` into the facts that size a KV cache.

The loader follows what transformers itself builds from the same file: the
family's config class fills fields the file leaves out, and the family's layer
pattern decides which layers slide (``layer_types`` when the file has it).
Anything kvcore cannot model, or that contradicts itself, is an error naming the
field; nothing is guessed. See docs/memory.md for the rules, field by field.
It reads files only: it imports neither torch nor transformers.

Every public name is importable from here; each lives in a module of one concept:

- ``kvcore.hf_config.shapes``: ``ModelShape`` and its special layers (``ChunkedLayer``,
  ``SharedLayer``, ``StateShape``, ``EmptyLayer``), ``MAX_CONTEXT``;
- ``kvcore.hf_config.families``: the model-family table (defaults and layer patterns of
  transformers' config classes) and the layer type names;
- ``kvcore.hf_config.reading``: ``load_hf_config``, a config's language model, its fields
  with the family's defaults;
- ``kvcore.hf_config.layer_types``: which kind each layer is, as each family derives it;
- ``kvcore.hf_config.state_shapes``: a recurrent layer's state size, per family;
- ``kvcore.hf_config.policies``: ``layer_config``, each layer kind's kvcore ``LayerConfig``
  (shared with ``kvcore.integrations.transformers_config.cache_config_for``), ``default_state_slots``;
- ``kvcore.hf_config.building``: ``model_shape_from_hf``, ``config_from_hf``, ``default_context``;
- ``kvcore.hf_config.fields``: one field's checks, shared by the others.
"""

from kvcore.hf_config.building import config_from_hf, default_context, model_shape_from_hf
from kvcore.hf_config.families import CHUNKED, FULL, HYBRID, SLIDING
from kvcore.hf_config.families import FAMILIES as _FAMILIES  # noqa: F401  # the tests' name of the table
from kvcore.hf_config.policies import DEFAULT_VERIFY_TOKENS, LAYER_KINDS, default_state_slots, layer_config
from kvcore.hf_config.reading import HFSource, load_hf_config
from kvcore.hf_config.shapes import (
    MAX_CONTEXT,
    ChunkedLayer,
    EmptyLayer,
    ModelShape,
    SharedLayer,
    SpecialLayer,
    StateShape,
)

__all__ = [
    "CHUNKED",
    "DEFAULT_VERIFY_TOKENS",
    "FULL",
    "HFSource",
    "HYBRID",
    "LAYER_KINDS",
    "MAX_CONTEXT",
    "SLIDING",
    "ChunkedLayer",
    "EmptyLayer",
    "ModelShape",
    "SharedLayer",
    "SpecialLayer",
    "StateShape",
    "config_from_hf",
    "default_context",
    "default_state_slots",
    "layer_config",
    "load_hf_config",
    "model_shape_from_hf",
]
