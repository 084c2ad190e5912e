"""The recurrent state of one layer of a hybrid model, per family: ``state_shape``.

The formulas come from each model's modeling code in transformers 5.24 (docs/memory.md,
"Recurrent state", cites each line); a model_type whose formula kvcore lacks is refused by name.
"""

from __future__ import annotations

from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.hf_config.families import HYBRID, STATE_FAMILIES
from kvcore.hf_config.fields import optional_int, quoted_names
from kvcore.hf_config.reading import Reader
from kvcore.hf_config.shapes import StateShape

def state_shape(r: Reader, kind: str, layer: int) -> StateShape:
    """The per-sequence state of a recurrent layer, from the model's modeling code in transformers
    5.24 (docs/memory.md, "Recurrent state", cites each line). NotSupportedError for a model_type
    whose state formula kvcore does not have; InvalidArgumentError for a missing or contradictory field."""
    mt = r.model_type
    if mt in ("qwen3_next", "qwen3_5_text") and kind == "linear_attention":
        # modeling_qwen3_next.Qwen3NextGatedDeltaNet, modeling_qwen3_5.Qwen3_5GatedDeltaNet: conv_dim =
        # 2 * key_dim + value_dim over linear_conv_kernel_dim columns; recurrent state (num_v_heads,
        # head_k_dim, head_v_dim), float32 (torch_chunk_gated_delta_rule casts its inputs .to(torch.float32)).
        width = _need(r, "linear_conv_kernel_dim")
        nk, dk = _need(r, "linear_num_key_heads"), _need(r, "linear_key_head_dim")
        nv, dv = _need(r, "linear_num_value_heads"), _need(r, "linear_value_head_dim")
        return StateShape("gated_deltanet", 2 * nk * dk + nv * dv, width, nv * dk * dv,
                          formula="conv (2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads "
                          "x linear_value_head_dim) x linear_conv_kernel_dim; recurrent linear_num_value_heads x "
                          "linear_key_head_dim x linear_value_head_dim float32")
    if mt in ("granitemoehybrid", "bamba") and kind == "linear_attention":
        # modeling_granitemoehybrid.GraniteMoeHybridMambaLayer, modeling_bamba.BambaMixer: conv_dim =
        # intermediate + 2 * n_groups * d_state over mamba_d_conv columns, intermediate = mamba_expand *
        # hidden_size; SSM state (mamba_n_heads, mamba_d_head, mamba_d_state), float32 (the chunked scan runs
        # in .float()).
        hidden, expand = _need(r, "hidden_size"), _need(r, "mamba_expand")
        heads, groups = _need(r, "mamba_n_heads"), _need(r, "mamba_n_groups")
        d_state, d_conv = _need(r, "mamba_d_state"), _need(r, "mamba_d_conv")
        inner = expand * hidden
        d_head = r.get("mamba_d_head")
        if d_head == "auto":
            d_head = inner // heads
        d_head = optional_int(d_head, "mamba_d_head")
        if d_head is None or d_head * heads != inner:
            raise InvalidArgumentError(
                f"mamba_d_head = {d_head}: mamba_n_heads x mamba_d_head must equal mamba_expand x hidden_size = {inner}"
            )
        return StateShape("mamba2", inner + 2 * groups * d_state, d_conv, heads * d_head * d_state,
                          formula="conv (mamba_expand x hidden_size + 2 x mamba_n_groups x mamba_d_state) x "
                          "mamba_d_conv; SSM mamba_n_heads x mamba_d_head x mamba_d_state float32")
    if mt == "falcon_h1" and kind == HYBRID:
        # modeling_falcon_h1.FalconH1Mixer: intermediate = mamba_d_ssm, or int(mamba_expand * hidden_size) when
        # it is None; conv_dim = intermediate + 2 * n_groups * d_state over mamba_d_conv columns; SSM state
        # (mamba_n_heads, mamba_d_head, mamba_d_state), float32 (mamba2_chunk_scan runs in .float()).
        # FalconH1Config: mamba_d_head "auto" = intermediate // mamba_n_heads.
        ssm = r.get("mamba_d_ssm")
        if ssm is None:
            inner = _need(r, "mamba_expand") * _need(r, "hidden_size")
            what = "mamba_expand x hidden_size"
        else:
            inner = _need(r, "mamba_d_ssm")
            what = "mamba_d_ssm"
        heads, groups = _need(r, "mamba_n_heads"), _need(r, "mamba_n_groups")
        d_state, d_conv = _need(r, "mamba_d_state"), _need(r, "mamba_d_conv")
        d_head = r.get("mamba_d_head")
        if d_head == "auto":
            d_head = inner // heads
        d_head = optional_int(d_head, "mamba_d_head")
        if d_head is None or d_head * heads != inner:
            raise InvalidArgumentError(
                f"mamba_d_head = {d_head}: mamba_n_heads x mamba_d_head must equal {what} = {inner}"
            )
        return StateShape("mamba2", inner + 2 * groups * d_state, d_conv, heads * d_head * d_state,
                          formula="conv (mamba_d_ssm, else mamba_expand x hidden_size, + 2 x mamba_n_groups x "
                          "mamba_d_state) x mamba_d_conv; SSM mamba_n_heads x mamba_d_head x mamba_d_state float32")
    if mt == "nemotron_h" and kind == "linear_attention":
        # modeling_nemotron_h.NemotronHMamba2Mixer: intermediate = mamba_num_heads * mamba_head_dim (not
        # expand * hidden_size), conv_dim = intermediate + 2 * n_groups * ssm_state_size over conv_kernel
        # columns; SSM state (mamba_num_heads, mamba_head_dim, ssm_state_size), float32 (mamba2_chunk_scan
        # runs in .float()). NemotronHConfig takes the legacy mamba_n_groups / mamba_d_conv over them.
        heads, d_head = _need(r, "mamba_num_heads"), _need(r, "mamba_head_dim")
        groups = _need(r, "mamba_n_groups" if "mamba_n_groups" in r.cfg else "n_groups")
        d_conv = _need(r, "mamba_d_conv" if "mamba_d_conv" in r.cfg else "conv_kernel")
        d_state = _need(r, "ssm_state_size")
        inner = heads * d_head
        return StateShape("mamba2", inner + 2 * groups * d_state, d_conv, heads * d_head * d_state,
                          formula="conv (mamba_num_heads x mamba_head_dim + 2 x n_groups x ssm_state_size) x "
                          "conv_kernel; SSM mamba_num_heads x mamba_head_dim x ssm_state_size float32")
    if mt == "jamba" and kind == "linear_attention":
        # modeling_jamba.JambaMambaMixer (Mamba-1): a depthwise conv over intermediate = mamba_expand *
        # hidden_size channels, mamba_d_conv columns; SSM state (intermediate, mamba_d_state), float32
        # (mamba_selective_scan's discretized A and B are float32, so the scanned state is).
        hidden, expand = _need(r, "hidden_size"), _need(r, "mamba_expand")
        d_state, d_conv = _need(r, "mamba_d_state"), _need(r, "mamba_d_conv")
        inner = expand * hidden
        return StateShape("mamba", inner, d_conv, inner * d_state,
                          formula="conv (mamba_expand x hidden_size) x mamba_d_conv; SSM (mamba_expand x "
                          "hidden_size) x mamba_d_state float32")
    if mt == "lfm2" and kind == "conv":
        # modeling_lfm2.Lfm2ShortConv: a depthwise conv over hidden_size channels, conv_L_cache columns.
        return StateShape("short_conv", _need(r, "hidden_size"), _need(r, "conv_L_cache"),
                          formula="conv hidden_size x conv_L_cache")
    raise NotSupportedError(
        f"layer_types[{layer}] = {kind!r}: kvcore knows the recurrent state of the 'linear_attention' layers of "
        f"model_type {quoted_names([t for t in STATE_FAMILIES if t != 'lfm2'])} and of the 'conv' layers of 'lfm2', "
        f"not those of {mt or '(missing)'!r}"
    )


def _need(r: Reader, key: str) -> int:
    value = r.optional_int(key)
    if value is None:
        raise InvalidArgumentError(f"{key}: missing, and model_type {r.model_type!r}'s recurrent layers need it")
    return value


__all__ = ["state_shape"]
