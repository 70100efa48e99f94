"""Predictions on a test file (``hyper-train predict``): each sample's conversation up to its
last assistant turn is the prompt, that turn the reference; the model's answers are generated
in left-padded batches and scored by :mod:`hyper_core.text_metrics`.

A test file is read like training data, by its extension (``.jsonl``/``.json``/``.parquet``,
through the registered formats); relative image paths resolve against ``image_dir``, else the
file's directory. A sample that cannot be used (bad JSON, a missing image) gets an ``error``
line instead of a prediction. On several ranks, each predicts its contiguous share
(:func:`~hyper_core.data.step_loader.rank_slice`) and rank 0 writes the lines in input order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .errors import UserError

if TYPE_CHECKING:
    from .adapters.base import GenerationPrompt
    from .generation import ChatModel, GenerationSettings
    from .registry import Registries


@attrs.frozen
class PromptSample:
    """One line of the test file: its prompt and reference, or why it cannot be used."""

    index: int
    source: str
    prompt: Any = None  # a Conversation
    reference: str | None = None
    error: str | None = None

    def record(self, prediction: str | None = None) -> dict[str, Any]:
        """The output line: index, source, prompt (its last user turn's text), reference,
        prediction (or error)."""
        out: dict[str, Any] = {"index": self.index, "source": self.source}
        if self.prompt is not None:
            users = [m for m in self.prompt.messages if m.role == "user"]
            out["prompt"] = users[-1].text if users else ""
        out["reference"] = self.reference
        if self.error is not None:
            out["error"] = self.error
        else:
            out["prediction"] = prediction
        return out


def read_test_file(
    path: str | Path, registries: Registries, image_dir: str | Path | None = None
) -> Sequence[Mapping[str, Any]]:
    """The raw samples of ``path``, read by the format its extension implies."""
    from .config.fields import format_options
    from .config.schema import infer_format
    from .data.jsonl import IMAGE_DIR_KEY, WithImageDir
    from .resolve import dataset_format

    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise UserError(f"--data {path}: no such file")
    name = infer_format(str(path))
    if name is None:
        raise UserError(f"--data {path}: expected a .jsonl, .json or .parquet file")
    fmt, options_class = dataset_format("--data", registries, name)
    rows = fmt(str(path), format_options(options_class, {}, "--data"), path.parent)
    if image_dir is None:
        return rows
    if not Path(image_dir).is_dir():
        raise UserError(f"--image-dir {image_dir}: no such directory")
    directory = str(Path(image_dir).resolve())
    if isinstance(rows, list):
        for row in rows:
            row[IMAGE_DIR_KEY] = directory
        return rows
    return WithImageDir(rows, directory)


def prompt_sample(raw: Mapping[str, Any], index: int) -> PromptSample:
    """The prompt and reference of one raw sample: the conversation before its last assistant
    turn and that turn's text; one without an assistant turn, ending in a user turn, is a
    prompt without a reference."""
    from .data.conversation import parse_conversation
    from .data.errors import SampleError
    from .data.jsonl import format_source

    source = format_source(raw, index)
    try:
        conversation = parse_conversation(raw)
    except SampleError as exc:
        unanswered = _with_empty_answer(raw)
        if unanswered is None:
            return PromptSample(index, source, error=f"{exc.reason}: {exc.message}")
        try:  # a prompt without an answer: parsed with an empty one, which is then dropped
            prompt = parse_conversation(unanswered).prompt_and_answer()[0]
        except SampleError:
            return PromptSample(index, source, error=f"{exc.reason}: {exc.message}")
        return PromptSample(index, source, prompt)
    prompt, reference = conversation.prompt_and_answer()
    return PromptSample(index, source, prompt, reference)


def _with_empty_answer(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """``raw`` with an empty assistant turn after its last user turn (``messages`` or LLaVA
    ``conversations``), or None when it ends in no user turn of those schemas."""
    for key, turn, role_key, user, text_key in (
        ("messages", {"role": "assistant", "content": ""}, "role", "user", "content"),
        ("conversations", {"from": "gpt", "value": ""}, "from", "human", "value"),
    ):
        turns = raw.get(key)
        if isinstance(turns, list) and turns and isinstance(turns[-1], Mapping):
            if turns[-1].get(role_key) == user and text_key in turns[-1]:
                return {**raw, key: [*turns, turn]}
    return None


def _prompt(chat: ChatModel, sample: PromptSample) -> GenerationPrompt | str:
    """The sample's generation prompt, or the error that stops it."""
    from .data.errors import SampleError

    try:
        return chat.adapter.generation_prompt(sample.prompt, chat.assets)
    except SampleError as exc:
        return f"{exc.reason}: {exc.message}"


def predict(
    chat: ChatModel,
    samples: Sequence[PromptSample],
    settings: GenerationSettings,
    *,
    batch_size: int,
    advance: Callable[[int], None] = lambda n: None,
) -> Iterator[dict[str, Any]]:
    """One output record per sample, in order; generation in batches of ``batch_size``
    usable samples; ``advance(n)`` after each ``n`` samples are done."""
    from .generation import decode, generate_batch_ids

    pending: list[tuple[PromptSample, Any]] = []

    def flush() -> Iterator[dict[str, Any]]:
        usable = [(s, p) for s, p in pending if not isinstance(p, str)]
        answers = iter(
            generate_batch_ids(chat.model, [p for _, p in usable], settings, chat.assets)
            if usable
            else []
        )
        for sample, prompt in pending:
            if isinstance(prompt, str):
                yield attrs.evolve(sample, error=prompt).record()
            else:
                yield sample.record(decode(chat.assets, next(answers)))
        advance(len(pending))
        pending.clear()

    for sample in samples:
        if sample.error is not None:
            pending.append((sample, sample.error))
        else:
            pending.append((sample, _prompt(chat, sample)))
        if sum(not isinstance(p, str) for _, p in pending) >= batch_size:
            yield from flush()
    if pending:
        yield from flush()


def write_records(path: Path, records: Iterator[dict[str, Any]] | Sequence[dict[str, Any]]) -> None:
    """One JSON object per line."""
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of :func:`write_records`."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
