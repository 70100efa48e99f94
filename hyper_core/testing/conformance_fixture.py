"""The subject of the adapter conformance checks: :class:`AdapterUnderTest`, an adapter with its
tiny config, assets, samples and a working folder.

Every check (:mod:`hyper_core.testing.conformance`, :mod:`.conformance_tokens`,
:mod:`.conformance_inference`, a plugin's own such as ``hyper_peft.conformance``) is a function
of one; :class:`~hyper_core.testing.conformance_suite.AdapterConformance` builds one per test
class.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any


def _text_samples() -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": "Say hello."},
                {"role": "assistant", "content": "hello"},
            ]
        },
        {
            "messages": [
                {"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What colour is the sky on a clear day?"},
                {"role": "assistant", "content": "blue, mostly"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Count to five."},
                {"role": "assistant", "content": "one two three four five"},
                {"role": "user", "content": "And back?"},
                {"role": "assistant", "content": "five four three two one"},
            ]
        },
    ]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    samples = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            samples.append({**json.loads(line), "_source": {"file": str(path), "line": i}})
    return samples


class AdapterUnderTest:
    """An adapter with its tiny config, assets, samples and a working folder (built lazily)."""

    def __init__(
        self,
        name: str,
        tiny_config: str | Mapping[str, Any] = "tiny",
        sample_data: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None = None,
        *,
        plugins: Iterable[Any] = (),
        workdir: str | os.PathLike[str] | None = None,
        max_seq_len: int = 2048,
    ) -> None:
        self.name = name
        self.tiny_config = tiny_config
        self.plugins = list(plugins)
        self.max_seq_len = max_seq_len
        self._sample_data = sample_data
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hyper-conformance-"))

    # -- what the checks use ------------------------------------------------------------------

    @cached_property
    def host(self) -> Any:
        """An isolated host with the given plugins (or every installed one when none given)."""
        from . import isolated_host

        return isolated_host(self.plugins, entry_points=not self.plugins)

    @cached_property
    def adapter(self) -> Any:
        """The adapter instance, resolved by name through the registry."""
        return self.host.registries.model_adapters.get(self.name)()

    def model_config(self, **overrides: Any) -> Any:
        """``[model]`` for the tiny config (a named config, or a mapping of ``[model]`` keys)."""
        from ..config.schema import ModelConfig

        base = (
            {"config": self.tiny_config}
            if isinstance(self.tiny_config, str)
            else dict(self.tiny_config)
        )
        return ModelConfig(**{"adapter": self.name, **base, **overrides})

    @cached_property
    def assets(self) -> Any:
        """Tokenizer and processor."""
        return self.adapter.build_assets(self.model_config())

    @property
    def is_vision(self) -> bool:
        """Whether the adapter has an image processor (the VL contract applies)."""
        return self.assets.processor is not None

    @cached_property
    def samples(self) -> list[dict[str, Any]]:
        """Raw samples: the given ones, else 0/1/2 odd-sized images (VL) or three chats."""
        data = self._sample_data
        if data is None:
            if not self.is_vision:
                return _text_samples()
            from .vl import vl_samples, write_test_images

            return vl_samples(write_test_images(self.workdir / "images"))
        if isinstance(data, (str, os.PathLike)):
            return _read_jsonl(Path(data))
        return [dict(s) for s in data]

    def features(self, samples: Sequence[Mapping[str, Any]] | None = None) -> list[Any]:
        """The adapter's transform of ``samples`` (default: :attr:`samples`)."""
        return [
            self.adapter.transform(s, self.assets, max_seq_len=self.max_seq_len)
            for s in (self.samples if samples is None else samples)
        ]

    def micro_batch(self, kind: str, features: Sequence[Any] | None = None) -> Any:
        """A ``packed`` or ``padded`` micro-batch of ``features`` by the core runtimes."""
        from ..attention import uses_varlen_kwargs
        from .vl import micro_batch

        feats = self.features() if features is None else list(features)
        varlen = uses_varlen_kwargs(self.model_config().attn_implementation)
        return micro_batch(feats, kind, self.assets.pad_token_id, varlen_kwargs=varlen)

    def build_model(self, **overrides: Any) -> Any:
        """A seeded random-init model on CPU (``path=...`` loads weights instead)."""
        import torch

        torch.manual_seed(0)
        return self.adapter.build_model(self.model_config(**overrides))

    def loss(self, model: Any, mb: Any) -> Any:
        """The training loss of ``mb`` with the adapter's forward kwargs."""
        from .vl import loss_of

        return loss_of(model, mb, forward_kwargs=self.adapter.forward_kwargs())
