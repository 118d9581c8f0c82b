"""Model families: what one architecture does differently, each a small strategy object.

The decoder asks the family of its config (:func:`family_for`) instead of branching on the
architecture: which projections carry biases, whether query and key heads are RMS-normalised,
which norms a layer holds and how a layer composes its attention and MLP, which layers rotate
(RoPE), and the tensor names and shapes a checkpoint must provide (Hugging Face names).

Importing this module loads no torch: the server checks uploaded checkpoints against
:meth:`DecoderFamily.shapes` without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from decodebench.contracts.presets import ModelConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    LayerOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

Shapes = dict[str, tuple[int, ...]]


class LayerParts(Protocol):
    """What a family's layer_forward reads of a decoder layer (the decoder's DecoderLayer)."""

    self_attn: Any
    mlp: Any

    def norm(self, name: str) -> Any: ...


class DecoderFamily:
    """A pre-norm decoder (Llama): ``h + attn(norm(h))``, then ``h + mlp(norm(h))``."""

    name: ClassVar[str] = "llama"
    architecture: ClassVar[str] = "LlamaForCausalLM"
    attention_bias: ClassVar[bool] = False
    qk_norm: ClassVar[bool] = False
    # The layer's norms, in Hugging Face's names.
    norms: ClassVar[tuple[str, ...]] = ("input_layernorm", "post_attention_layernorm")
    # The gated MLP's activation: "silu" or "gelu_tanh".
    activation: ClassVar[str] = "silu"

    def embed_scale(self, config: ModelConfig) -> float | None:
        """What the embeddings are multiplied by, in the compute dtype (none: not at all)."""
        return None

    def sliding(self, config: ModelConfig, index: int) -> bool:
        """Whether layer ``index`` attends to the last ``sliding_window`` keys only."""
        return False

    def rope_theta(self, config: ModelConfig, sliding: bool) -> float:
        """The RoPE base of a global or a sliding layer."""
        return config.rope_theta

    def add_norms(self, layer: nn.Module, config: ModelConfig) -> None:
        from decodebench.modeling.layers import RMSNorm

        for norm in self.norms:
            layer.add_module(norm, RMSNorm(config.hidden_size, config.rms_norm_eps))

    def layer_forward(
        self, layer: LayerParts, hidden: torch.Tensor, *attention_args: torch.Tensor | None
    ) -> LayerOutput:
        attended, key, value = layer.self_attn(
            layer.norm("input_layernorm")(hidden), *attention_args
        )
        hidden = hidden + attended
        return hidden + layer.mlp(layer.norm("post_attention_layernorm")(hidden)), key, value

    def rotary(self, config: ModelConfig, index: int) -> bool:
        """Whether layer ``index`` applies RoPE to its queries and keys."""
        return True

    def layer_shapes(self, config: ModelConfig) -> Shapes:
        """One layer's tensors (names relative to ``model.layers.N.``) with their shapes."""
        hidden, head_dim = config.hidden_size, config.head_dim
        q_size = config.num_attention_heads * head_dim
        kv_size = config.num_key_value_heads * head_dim
        shapes: Shapes = {
            "self_attn.q_proj.weight": (q_size, hidden),
            "self_attn.k_proj.weight": (kv_size, hidden),
            "self_attn.v_proj.weight": (kv_size, hidden),
            "self_attn.o_proj.weight": (hidden, q_size),
        }
        if self.attention_bias:
            shapes["self_attn.q_proj.bias"] = (q_size,)
            shapes["self_attn.k_proj.bias"] = (kv_size,)
            shapes["self_attn.v_proj.bias"] = (kv_size,)
        if self.qk_norm:
            shapes["self_attn.q_norm.weight"] = (head_dim,)
            shapes["self_attn.k_norm.weight"] = (head_dim,)
        shapes["mlp.gate_proj.weight"] = (config.intermediate_size, hidden)
        shapes["mlp.up_proj.weight"] = (config.intermediate_size, hidden)
        shapes["mlp.down_proj.weight"] = (hidden, config.intermediate_size)
        for norm in self.norms:
            shapes[f"{norm}.weight"] = (hidden,)
        return shapes

    def decoder_tensors(self, config: ModelConfig, tensors: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's tensors under the decoder's parameter names (the same, here)."""
        return tensors

    def shapes(self, config: ModelConfig) -> Shapes:
        """Every tensor the decoder needs, with its shape (Hugging Face names)."""
        shapes: Shapes = {
            "model.embed_tokens.weight": (config.vocab_size, config.hidden_size),
            "model.norm.weight": (config.hidden_size,),
        }
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (config.vocab_size, config.hidden_size)
        layer = self.layer_shapes(config)
        for index in range(config.num_layers):
            shapes.update({f"model.layers.{index}.{name}": shape for name, shape in layer.items()})
        return shapes


class Llama(DecoderFamily):
    pass


class Qwen2(DecoderFamily):
    """Llama with biases on q, k and v (not on o)."""

    name = "qwen2"
    architecture = "Qwen2ForCausalLM"
    attention_bias = True


class Qwen3(DecoderFamily):
    """Llama with every query and key head RMS-normalised over head_dim before RoPE; no biases.

    ``head_dim`` is its own config figure (128 on Qwen3-0.6B, where hidden / heads is 64).
    """

    name = "qwen3"
    architecture = "Qwen3ForCausalLM"
    qk_norm = True


class SmolLM3(DecoderFamily):
    """Llama whose every ``no_rope_layer_interval``-th layer attends without RoPE (NoPE).

    ``config.no_rope_layers[i]`` is 1 where layer i rotates, 0 where it does not (Hugging Face's
    convention and name).
    """

    name = "smollm3"
    architecture = "SmolLM3ForCausalLM"

    def rotary(self, config: ModelConfig, index: int) -> bool:
        layers = config.no_rope_layers
        return layers is None or bool(layers[index])


class Exaone4(DecoderFamily):
    """QK-norm, and each sub-block's *output* normalised (post-norm) instead of its input.

    Note ``post_attention_layernorm`` is the norm of the attention output here, the norm before
    the MLP in Llama.
    """

    name = "exaone4"
    architecture = "Exaone4ForCausalLM"
    qk_norm = True
    norms = ("post_attention_layernorm", "post_feedforward_layernorm")

    def layer_forward(
        self, layer: LayerParts, hidden: torch.Tensor, *attention_args: torch.Tensor | None
    ) -> LayerOutput:
        attended, key, value = layer.self_attn(hidden, *attention_args)
        hidden = hidden + layer.norm("post_attention_layernorm")(attended)
        return hidden + layer.norm("post_feedforward_layernorm")(layer.mlp(hidden)), key, value


class Gemma3(DecoderFamily):
    """Gemma 3 text: q/k norms, four norms per layer (each sub-block's input and output), RMSNorm
    gains stored as ``w`` for ``1 + w``, embeddings times sqrt(hidden), GELU-tanh, and local
    layers with a sliding window and their own RoPE base between global ones.

    ``1 + w`` is added when a checkpoint is loaded, so the decoder's norm is the same module.
    """

    name = "gemma3"
    architecture = "Gemma3ForCausalLM"
    qk_norm = True
    norms = (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    )
    activation = "gelu_tanh"

    def embed_scale(self, config: ModelConfig) -> float | None:
        return float(config.hidden_size**0.5)

    def sliding(self, config: ModelConfig, index: int) -> bool:
        layers = config.sliding_layers
        return layers is not None and bool(layers[index])

    def rope_theta(self, config: ModelConfig, sliding: bool) -> float:
        if sliding and config.rope_local_theta is not None:
            return config.rope_local_theta
        return config.rope_theta

    def layer_forward(
        self, layer: LayerParts, hidden: torch.Tensor, *attention_args: torch.Tensor | None
    ) -> LayerOutput:
        attended, key, value = layer.self_attn(
            layer.norm("input_layernorm")(hidden), *attention_args
        )
        hidden = hidden + layer.norm("post_attention_layernorm")(attended)
        out = layer.mlp(layer.norm("pre_feedforward_layernorm")(hidden))
        return hidden + layer.norm("post_feedforward_layernorm")(out), key, value

    def decoder_tensors(self, config: ModelConfig, tensors: dict[str, Any]) -> dict[str, Any]:
        # In fp32, then back: the stored gain is rounded once, like every weight.
        return {
            name: (tensor.float() + 1).to(tensor.dtype) if name.endswith("norm.weight") else tensor
            for name, tensor in tensors.items()
        }


class Phi3(DecoderFamily):
    """Llama with fused ``qkv_proj`` and ``gate_up_proj`` (gate first), partial rotary and
    LongRoPE (both in the config's RoPE tables).

    The fused matrices are split when loaded: a decode step reads the same weight bytes either
    way, and separate q/k/v and gate/up keep one decoder graph, the KV fold's patterns and the
    quantization recipes' per-projection targets as for every other family.
    """

    name = "phi3"
    architecture = "Phi3ForCausalLM"

    def layer_shapes(self, config: ModelConfig) -> Shapes:
        split = super().layer_shapes(config)
        hidden = config.hidden_size
        fused = {
            "self_attn.qkv_proj.weight": (
                sum(split[f"self_attn.{part}_proj.weight"][0] for part in "qkv"),
                hidden,
            ),
            "mlp.gate_up_proj.weight": (2 * config.intermediate_size, hidden),
        }
        parts = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj")
        kept = {
            name: shape
            for name, shape in split.items()
            if not name.startswith(parts) and name != "mlp.up_proj.weight"
        }
        return {**fused, **kept}

    def decoder_tensors(self, config: ModelConfig, tensors: dict[str, Any]) -> dict[str, Any]:
        q_size = config.num_attention_heads * config.head_dim
        kv_size = config.num_key_value_heads * config.head_dim
        result = {}
        for name, tensor in tensors.items():
            prefix, _, rest = name.rpartition("self_attn.qkv_proj.")
            if rest == "weight":
                query, key, value = tensor.split((q_size, kv_size, kv_size))
                for part, piece in zip("qkv", (query, key, value), strict=True):
                    result[f"{prefix}self_attn.{part}_proj.weight"] = piece.contiguous()
                continue
            prefix, _, rest = name.rpartition("mlp.gate_up_proj.")
            if rest == "weight":
                gate, up = tensor.chunk(2)
                result[f"{prefix}mlp.gate_proj.weight"] = gate.contiguous()
                result[f"{prefix}mlp.up_proj.weight"] = up.contiguous()
                continue
            result[name] = tensor
        return result


FAMILIES: dict[str, DecoderFamily] = {
    family.name: family() for family in (Llama, Qwen2, Qwen3, SmolLM3, Exaone4, Phi3, Gemma3)
}


def family_for(config: ModelConfig) -> DecoderFamily:
    return FAMILIES[config.family]
