"""Answers from a trained model: load a checkpoint or an export, prompt it, ``generate``.

The prompt goes through the adapter's own transform (:meth:`ModelAdapter.generation_prompt`),
so it is tokenised exactly as in training, images included; the answer is the new tokens up to
the end-of-turn token. ``hyper-train chat`` and evaluation's sample generations use this.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .errors import UserError
from .export import EXPORT_RUN_CONFIG

if TYPE_CHECKING:
    import torch

    from .adapters.base import GenerationPrompt, ModelAdapter, ModelAssets
    from .data.conversation import Conversation
    from .plugins.manager import PluginHost


@attrs.frozen(kw_only=True)
class GenerationSettings:
    """How answers are decoded: greedy when ``temperature`` is 0."""

    max_new_tokens: int = 128
    temperature: float = 0.0


@attrs.define(kw_only=True)
class ChatModel:
    """A model ready to answer: adapter, weights (eval mode) and tokenizer/processor."""

    adapter: ModelAdapter
    model: torch.nn.Module
    assets: ModelAssets

    def answer(
        self, messages: Sequence[Mapping[str, Any]], settings: GenerationSettings | None = None
    ) -> str:
        """The assistant's reply to ``messages`` (HF chat messages, ending in a user turn)."""
        conversation = prompt_conversation(messages)
        prompt = build_prompt(self.adapter, conversation, self.assets)
        ids = generate_answer_ids(self.model, prompt, settings or GenerationSettings(), self.assets)
        return decode(self.assets, ids)


def prompt_conversation(messages: Sequence[Mapping[str, Any]]) -> Conversation:
    """The :class:`Conversation` of chat ``messages``; images as paths or PIL images."""
    from .data.conversation import parse_conversation
    from .data.errors import SampleError

    # Parsed with the answer's (empty) turn, which a sample needs, then without it.
    turns = [*(dict(m) for m in messages), {"role": "assistant", "content": ""}]
    try:
        return parse_conversation({"messages": turns}).prompt_and_answer()[0]
    except SampleError as exc:
        raise UserError(f"prompt: {exc.reason}: {exc.message}") from None


def build_prompt(
    adapter: ModelAdapter, conversation: Conversation, assets: ModelAssets
) -> GenerationPrompt:
    """The adapter's generation prompt; bad input (a corrupt image...) is a :class:`UserError`."""
    from .data.errors import SampleError

    try:
        return adapter.generation_prompt(conversation, assets)
    except SampleError as exc:
        raise UserError(f"prompt: {exc.reason}: {exc.message}") from None


def generate_answer_ids(
    model: torch.nn.Module,
    prompt: GenerationPrompt,
    settings: GenerationSettings,
    assets: ModelAssets,
    *,
    fixed_length: bool = False,
) -> list[int]:
    """The generated token ids up to (without) the first end-of-turn token.

    ``fixed_length``: run exactly ``max_new_tokens`` forwards whatever is generated, so that
    ranks of a sharded model, which all-gather in every forward, stay in step.
    """
    (ids,) = generate_batch_ids(model, [prompt], settings, assets, fixed_length=fixed_length)
    return ids


def _left_padded(prompts: Sequence[GenerationPrompt], pad_id: int) -> dict[str, Any]:
    """The prompts as one batch, each row left-padded (its attention mask 0 there): ids and
    per-token fields padded, media concatenated in order as the model's forward takes them."""
    import torch

    feats = [p.features for p in prompts]
    width = max(f.input_ids.shape[0] for f in feats)

    def pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
        return torch.stack(
            [torch.nn.functional.pad(r, (width - r.shape[0], 0), value=value) for r in rows]
        )

    inputs: dict[str, Any] = {
        "input_ids": pad([f.input_ids for f in feats], pad_id),
        "attention_mask": pad([torch.ones_like(f.input_ids) for f in feats], 0),
    }
    for key in feats[0].token_fields:
        inputs[key] = pad([f.token_fields[key] for f in feats], 0)
    for key in {k for f in feats for k in f.media}:
        inputs[key] = torch.cat([f.media[key] for f in feats if key in f.media])
    return inputs


def generate_batch_ids(
    model: torch.nn.Module,
    prompts: Sequence[GenerationPrompt],
    settings: GenerationSettings,
    assets: ModelAssets,
    *,
    fixed_length: bool = False,
) -> list[list[int]]:
    """For each prompt, the generated ids up to (without) its first end-of-turn token; the
    prompts are generated as one left-padded batch (see :func:`generate_answer_ids`)."""
    import torch
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    inputs = _left_padded(prompts, assets.pad_token_id)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    stop: list[int] = []
    for prompt in prompts:
        stop += [int(t) for t in prompt.stop_token_ids if int(t) not in stop]
    eos = getattr(assets.tokenizer, "eos_token_id", None)
    if eos is not None and eos not in stop:
        stop.append(int(eos))
    sample = settings.temperature > 0
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=0,
        do_sample=sample,
        temperature=settings.temperature if sample else None,
        top_p=None,
        top_k=None,
        eos_token_id=None if fixed_length else stop,
        pad_token_id=assets.pad_token_id,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(**inputs, generation_config=config)
    finally:
        model.train(was_training)
    answers = []
    for row in out[:, inputs["input_ids"].shape[1] :].tolist():
        cut = next((i for i, token in enumerate(row) if token in stop), len(row))
        answers.append([int(t) for t in row[:cut]])
    return answers


def decode(assets: ModelAssets, ids: Sequence[int]) -> str:
    """Text of generated ids, special tokens dropped."""
    return str(assets.tokenizer.decode(list(ids), skip_special_tokens=True)).strip()


# -- chat ---------------------------------------------------------------------------------------

#: Lines that end an interactive chat.
EXIT_LINES = ("exit", "quit")


def check_image(path: str | Path, where: str) -> str:
    """``path`` made absolute; :class:`UserError` naming ``where`` if it is not a file."""
    image = Path(path).expanduser()
    if not image.is_file():
        raise UserError(f"{where} {path}: no such image file")
    return str(image.resolve())


def chat_lines(
    chat: ChatModel,
    lines: Iterable[str],
    *,
    images: Sequence[str] = (),
    system: str | None = None,
    settings: GenerationSettings | None = None,
) -> Iterator[str]:
    """One answer per user line, the conversation kept as context.

    ``images`` go with the first message; ``/image PATH`` attaches one to the next message,
    ``/clear`` starts a new conversation, ``exit``/``quit`` ends.
    """
    head = [{"role": "system", "content": system}] if system else []
    history: list[dict[str, Any]] = []
    pending = list(images)
    for line in lines:
        text = line.strip()
        if text in EXIT_LINES:
            return
        if text.startswith("/image "):
            pending.append(check_image(text.removeprefix("/image ").strip(), "/image"))
            continue
        if text == "/clear":
            history, pending = [], []
            continue
        if not text:
            continue
        content: str | list[dict[str, Any]] = text
        if pending:
            content = [
                *({"type": "image", "image": p} for p in pending),
                {"type": "text", "text": text},
            ]
        user = {"role": "user", "content": content}
        answer = chat.answer([*head, *history, user], settings)
        history += [user, {"role": "assistant", "content": answer}]
        pending = []
        yield answer


# -- loading ------------------------------------------------------------------------------------


def is_export_dir(path: Path) -> bool:
    """A Hugging Face model folder: ``config.json`` and safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def load_chat_model(
    path: str | Path,
    host: PluginHost,
    *,
    config_path: str | Path | None = None,
    adapter: str | None = None,
    device: str | None = None,
) -> ChatModel:
    """The model of ``path``: an exported folder, a ``checkpoints/step-N`` folder, the
    ``checkpoints/latest`` pointer, or a run's ``output_dir`` (its latest complete checkpoint,
    else its ``hf/`` export).

    A checkpoint (and an export that records its run's config, :data:`EXPORT_RUN_CONFIG`, such
    as a LoRA adapter directory) is loaded by a plugin's ``load_checkpoint_model`` hook, else in
    full by :func:`load_checkpoint_model`. It needs the run's config
    (``output_dir/config.toml``, or ``config.step-M.toml`` of a resumed run, or
    ``config_path``). An export's adapter is ``adapter``, else its run's
    (``output_dir/hf``), else the one that config.json's ``model_type`` names.
    ``device``: default CUDA when available, else the CPU.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint, run folder or exported model")
    import torch

    from .checkpoint import resolve_checkpoint

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available here")
    if is_export_dir(path):
        chat = _load_export(path, host, adapter)
    elif (path / EXPORT_RUN_CONFIG).is_file():
        chat = _load_checkpoint(path, host, config_path or path / EXPORT_RUN_CONFIG)
    else:
        try:
            checkpoint = resolve_checkpoint(path)
        except UserError:
            if path.is_file() and path.name == "latest":
                raise  # names the step it points to
            if is_export_dir(path / "hf"):
                chat = _load_export(path / "hf", host, adapter)
            elif (path / "hf" / EXPORT_RUN_CONFIG).is_file():
                chat = _load_checkpoint(path / "hf", host, path / "hf" / EXPORT_RUN_CONFIG)
            else:
                raise UserError(
                    f"{path}: not a checkpoint, a run's output_dir with one, or an exported "
                    "model (config.json + *.safetensors, or a LoRA adapter directory)"
                ) from None
        else:
            chat = _load_checkpoint(checkpoint, host, config_path)
    chat.model.to(device)
    chat.model.eval()
    return chat


def _load_export(path: Path, host: PluginHost, adapter_name: str | None) -> ChatModel:
    from .config import ModelConfig
    from .resolve import resolve_adapter

    model_config = ModelConfig(path=str(path), adapter=adapter_name or _run_adapter(path))
    adapter = resolve_adapter(model_config, host.registries)
    model = adapter.build_model(model_config)
    return ChatModel(adapter=adapter, model=model, assets=adapter.build_assets(model_config))


def _run_adapter(export: Path) -> str | None:
    """The adapter the export records, else that of the run whose ``output_dir/hf`` is
    ``export`` (config.json's ``model_type`` may name no adapter, e.g. ``qwen2`` for
    ``hf_causal_lm``)."""
    from .config import read_toml
    from .export import read_export_adapter

    recorded = read_export_adapter(export)
    if recorded is not None:
        return recorded

    run_config = export.parent / "config.toml"
    if export.name != "hf" or not run_config.is_file():
        return None
    adapter = read_toml(run_config).get("model", {}).get("adapter")
    return adapter if isinstance(adapter, str) else None


def _load_checkpoint(checkpoint: Path, host: PluginHost, config_path: str | Path | None) -> Any:
    from .checkpoint import COMPLETE, run_config_for
    from .config import load_config

    config_file = Path(config_path) if config_path else run_config_for(checkpoint)
    if config_file is None or not config_file.is_file():
        where = config_file or checkpoint.parent.parent / "config.toml"
        raise UserError(f"{where}: no config found for {checkpoint} (pass --config)")
    config = load_config(config_file, (), host.registries.config_sections)
    loaded = host.call_stage(
        "load_checkpoint_model", config=config, registries=host.registries, checkpoint=checkpoint
    )
    if loaded is None:
        if not (checkpoint / COMPLETE).is_file():
            raise UserError(
                f"{checkpoint}: an export that no installed plugin loads (its run's config "
                f"{config_file} names the plugin that wrote it)"
            )
        loaded = load_checkpoint_model(config, host, checkpoint)
    adapter, model = loaded
    return ChatModel(adapter=adapter, model=model, assets=adapter.build_assets(config.model))


def load_checkpoint_model(
    config: Any, host: PluginHost, checkpoint: Path
) -> tuple[ModelAdapter, torch.nn.Module]:
    """The adapter and the CPU model of a DCP checkpoint (saved on any number of ranks).

    The model is built as configured, then its weights are replaced by the checkpoint's (DCP
    reshards). Built in full rather than on meta: non-persistent buffers (rotary
    frequencies) are not in a checkpoint and must come from the model's own construction.
    """
    import warnings

    import torch.distributed.checkpoint as dcp

    from .resolve import resolve_adapter

    adapter = resolve_adapter(config.model, host.registries)
    model = adapter.build_model(config.model, device="cpu")
    state = {"model": model.state_dict()}
    saved = dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    missing = [k for k in state["model"] if f"model.{k}" not in saved]
    if missing:
        raise UserError(
            f"{checkpoint}: holds part of the model (not {missing[0]}, {len(missing)} of "
            f"{len(state['model'])} weights missing), e.g. a LoRA run's adapters: load it with "
            "its run's config and the plugin that trained it"
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict(state["model"])
    return adapter, model
