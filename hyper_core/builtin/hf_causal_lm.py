"""``hf_causal_lm``: the generic text adapter for any transformers causal-LM config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..adapters.base import ModelAssets
from ..adapters.hf import HFModelAdapter
from ..data.chat import QWEN_CHATML, ChatFormat
from ..errors import ConfigError, UserError

if TYPE_CHECKING:
    from ..batching.types import SampleFeatures
    from ..export import CheckpointLayout

_TINY_COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "vocab_size": 1024,
    "tie_word_embeddings": True,
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer_files(path: str | Path | None) -> bool:
    """Whether a model directory ships its own tokenizer."""
    return path is not None and any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def load_local_tokenizer(path: str | Path, trust_remote_code: bool) -> Any:
    """The tokenizer saved in a local HF directory (never downloads)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(path), local_files_only=True, trust_remote_code=trust_remote_code
    )


class HFCausalLMAdapter(HFModelAdapter):
    """Any ``AutoModelForCausalLM`` model; text conversations in ChatML (:attr:`chat_format`)."""

    name = "hf_causal_lm"
    #: The text chat format: the transform's and, for the offline tokenizer, the saved template.
    chat_format: ClassVar[ChatFormat] = QWEN_CHATML
    default_batching = "packed"
    model_class = "transformers:AutoModelForCausalLM"
    sharding_units = ("model.layers.*",)
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "tiny": {"model_type": "qwen2", **_TINY_COMMON},
        "tiny-qwen2": {"model_type": "qwen2", **_TINY_COMMON},
        "tiny-llama": {"model_type": "llama", **_TINY_COMMON},
    }

    def _config_from_dir(self, path: Path, trust_remote_code: bool) -> Any:
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=trust_remote_code
            )
        except ValueError as exc:
            if trust_remote_code or "trust_remote_code" not in str(exc):
                raise
        raise ConfigError(
            [
                (
                    "$.model.trust_remote_code",
                    f"{path} is a model whose code ships in the directory (config.json "
                    "auto_map); set trust_remote_code = true to run that code, only for a "
                    "directory you trust",
                )
            ]
        )

    def _named_config(self, kwargs: Mapping[str, Any]) -> Any:
        from transformers import AutoConfig

        kwargs = dict(kwargs)
        return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)

    def model_cls(self, hf_config: Any, trust_remote_code: bool) -> Any:
        """The concrete class for the config (``_from_config`` needs it): with
        ``trust_remote_code``, the directory's own class when config.json ``auto_map`` names
        one for ``AutoModelForCausalLM`` (as the Auto class would pick), else transformers'."""
        from transformers import AutoModelForCausalLM

        auto_map = getattr(hf_config, "auto_map", None) or {}
        ref = auto_map.get("AutoModelForCausalLM")
        if trust_remote_code and ref:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            ref = ref[0] if isinstance(ref, (list, tuple)) else ref
            return get_class_from_dynamic_module(
                ref, hf_config._name_or_path, local_files_only=True
            )
        try:
            return AutoModelForCausalLM._model_mapping[type(hf_config)]
        except KeyError:
            kind = getattr(hf_config, "model_type", None) or type(hf_config).__name__
            hint = "" if trust_remote_code else "; with config.json auto_map: trust_remote_code"
            raise UserError(
                f"$.model: {kind!r} has no causal-LM class in transformers (nor an auto_map "
                f"AutoModelForCausalLM entry in config.json){hint}"
            ) from None

    def checkpoint_layout(self, hf_config: Any) -> CheckpointLayout:
        """What ``save_pretrained`` of the concrete causal-LM class writes."""
        from ..export import hf_layout

        # A config of the directory's own code was only loaded with trust_remote_code on.
        return hf_layout(self.model_cls(hf_config, _is_remote_code(hf_config)), hf_config)

    # -- data ---------------------------------------------------------------------------------

    def build_assets(self, model_config: Any) -> ModelAssets:
        """The directory's tokenizer when it has one, else the offline demo tokenizer."""
        if has_tokenizer_files(model_config.path):
            tok = load_local_tokenizer(model_config.path, model_config.trust_remote_code)
        else:
            from ..data.tokenizer import build_offline_tokenizer

            tok = build_offline_tokenizer(
                special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                chat_template=self.chat_format.chat_template,
                vocab_size=1024,
            )
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return ModelAssets(tokenizer=tok, pad_token_id=int(pad or 0))

    def transform(
        self, sample: Mapping[str, Any], assets: ModelAssets, *, max_seq_len: int
    ) -> SampleFeatures:
        """ChatML conversation → tokens with loss on assistant turns."""
        import torch

        from ..batching.types import SampleFeatures
        from ..data.chat import tokenize_conversation
        from ..data.conversation import parse_conversation
        from ..data.errors import SampleError

        conv = parse_conversation(sample)
        if conv.num_images:
            raise SampleError("bad_format", "hf_causal_lm is a text adapter; the sample has images")
        tok = tokenize_conversation(
            conv, assets.tokenizer, self.chat_format, image_tokens=None, max_seq_len=max_seq_len
        )
        return SampleFeatures(
            input_ids=torch.tensor(tok.input_ids, dtype=torch.long),
            labels=torch.tensor(tok.labels, dtype=torch.long),
            meta=dict(sample.get("meta") or {}),
        )


def _is_remote_code(hf_config: Any) -> bool:
    """Whether the config's class came from a model directory's code (``auto_map``)."""
    return type(hf_config).__module__.startswith("transformers_modules")
