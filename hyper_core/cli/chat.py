"""``hyper-train chat MODEL``: answer prompts with a trained model, once (``--prompt``) or one
line of stdin at a time, the conversation kept as context."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from .host import plugin_host
from .parser import CommandParser

if TYPE_CHECKING:
    from ..generation import ChatModel, GenerationSettings


def add_chat(parser: CommandParser) -> None:
    """``chat MODEL``'s options."""
    parser.add_argument(
        "model",
        help="a checkpoints/step-N folder, checkpoints/latest, a run's output_dir or an export "
        "(a LoRA adapter directory too)",
    )
    parser.add_argument("--prompt", default=None, help="answer this one message and exit")
    parser.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="attach an image (repeatable)"
    )
    parser.add_argument("--system", default=None, help="a system message")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="longest answer (tokens)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--config", default=None, help="the run's config (for a checkpoint)")
    parser.add_argument("--adapter", default=None, help="the model adapter (for an export)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")


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


def cmd_chat(args: argparse.Namespace) -> int:
    """``hyper-train chat MODEL [--image PATH] [--prompt TEXT]``."""
    from ..generation import GenerationSettings
    from ..trained_model import load_chat_model

    images = [check_image(p, "--image") for p in args.image]
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: expected at least 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise UserError(f"--temperature: expected at least 0, got {args.temperature}")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    chat = load_chat_model(
        args.model,
        plugin_host(args),
        config_path=args.config,
        adapter=args.adapter,
        device=args.device,
    )
    lines = [args.prompt] if args.prompt is not None else _stdin_lines()
    for answer in chat_lines(chat, lines, images=images, system=args.system, settings=settings):
        print(answer, flush=True)
    return 0


def _stdin_lines() -> Iterator[str]:
    """Lines of stdin, with a ``> `` prompt on a terminal."""
    if sys.stdin.isatty():
        while True:
            try:
                yield input("> ")
            except EOFError:
                return
    else:
        for line in sys.stdin:
            yield line.rstrip("\n")
