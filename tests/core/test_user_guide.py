"""docs/user-guide.md stays true to the code.

* every ```toml block validates against the real schema (with the installed plugins' sections)
  and names registered components: a block with ``[model]``, ``[data]`` and ``[training]`` on
  its own, any other block merged onto ``configs/text_demo.toml``;
* every ```jsonl line is a conversation the core accepts;
* every ``hyper-train SUBCOMMAND`` in code exists in the CLI parser, with its ``--flags``;
* every ```console block is a transcript: its ``hyper-train`` commands are re-run (in a fresh
  folder that has the repository's ``configs/``; ``/data/sft/train.jsonl`` is a file whose line 3
  is the guide's bad line) and must print exactly what the guide shows, and ``echo $?`` must
  give the exit code shown;
* the multi-rank failure line quoted in the troubleshooting section is what the launcher prints.

No command here trains: config checks, dry runs, and runs that stop on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

from hyper_core.config import load_config_dict, read_toml
from hyper_core.config.loader import tomllib

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "user-guide.md"
TEXT = GUIDE.read_text(encoding="utf-8")
BASE_CONFIG = REPO / "configs" / "text_demo.toml"

#: Line 3 of the troubleshooting example's /data/sft/train.jsonl (a missing comma).
BAD_LINE = (
    '{"messages": [{"role": "user", "content": "Repeat: stone"} '
    '{"role": "assistant", "content": "stone"}]}'
)
FAKE_DATA_DIR = "/data/sft"


@attrs.frozen
class Block:
    lang: str
    text: str
    line: int  # 1-based line of the opening fence


def fenced_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m:
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"unclosed code block at line {start + 1}"
            blocks.append(Block(m.group(1), "\n".join(body) + "\n", start + 1))
        i += 1
    return blocks


BLOCKS = fenced_blocks(TEXT)


def blocks_of(lang: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang]


def prose(text: str) -> str:
    """The guide without its fenced blocks."""
    return re.sub(r"^```.*?^```\s*$", "", text, flags=re.S | re.M)


def test_guide_has_its_sections() -> None:
    headings = re.findall(r"^## (.+)$", TEXT, flags=re.M)
    for name in (
        "Install",
        "First run",
        "The config file",
        "Data",
        "Models",
        "Distributed training",
        "Checkpoints and resume",
        "Operations",
        "Export to Hugging Face",
        "Evaluation",
        "Metrics and plots",
        "Plugins",
        "Troubleshooting",
    ):
        assert name in headings, f"section {name!r} missing; have {headings}"
    assert "(configuration.md)" in TEXT  # the generated key reference is linked


# -- plugin host ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host() -> Any:
    from hyper_core.plugins import get_plugin_host

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HYPER_TRAIN_PLUG")}
    try:
        yield get_plugin_host()
    finally:
        os.environ.update(saved)


# -- TOML blocks ----------------------------------------------------------------------------

TOML_BLOCKS = blocks_of("toml")
#: Keys of which a config sets one: a snippet that sets one drops the base's other.
EXCLUSIVE = {("model", "path"): ("config",), ("model", "config"): ("path",)}
EXCLUSIVE |= {("training", "steps"): ("epochs",), ("training", "epochs"): ("steps",)}


def merged_config(snippet: dict[str, Any]) -> dict[str, Any]:
    """``snippet`` alone when it is a whole config, else merged onto configs/text_demo.toml."""
    if {"model", "data", "training"} <= snippet.keys():
        return snippet
    base = read_toml(BASE_CONFIG)
    for (section, key), others in EXCLUSIVE.items():
        if key in snippet.get(section, {}):
            for other in others:
                base.get(section, {}).pop(other, None)
    if {"path", "config"} & snippet.get("model", {}).keys():
        base["model"].pop("adapter", None)  # the snippet says which model
    for section, table in snippet.items():
        if isinstance(table, dict) and isinstance(base.get(section), dict):
            base[section] = {**base[section], **table}
        else:
            base[section] = table
    return base


def test_there_are_toml_blocks() -> None:
    assert len(TOML_BLOCKS) >= 10


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=[f"line{b.line}" for b in TOML_BLOCKS])
def test_toml_block_is_a_valid_config(block: Block, host: Any) -> None:
    from hyper_core.cli.host import check_required_plugins

    snippet = tomllib.loads(block.text)
    data = merged_config(snippet)
    config = load_config_dict(data, str(BASE_CONFIG), host.registries.config_sections)
    reg = host.registries
    if config.model.adapter is not None:
        reg.model_adapters.entry(config.model.adapter)
    if config.data.batching is not None:
        reg.batching_runtimes.entry(config.data.batching)
    reg.parallel_strategies.entry(config.parallel.strategy)
    from hyper_core.config.schema import source_list

    for sources in (config.data.train, config.data.eval):
        if sources is not None:
            for _, source in source_list(sources, "$"):
                reg.dataset_formats.entry(source.format)
    check_required_plugins(host, config.run.plugins)
    for section in snippet:  # plugin sections were really validated, not dropped
        assert config.section(section) is not None, section


def test_toml_check_catches_mistakes(host: Any) -> None:
    """The merge does not hide errors: a bad snippet fails like a bad file."""
    from hyper_core.errors import ConfigError

    for bad in ('[training]\nlr = "1e-4"\n', "[trainig]\nlr = 1e-4\n", "[model]\nconfig = 't'\n"):
        with pytest.raises(ConfigError):
            load_config_dict(
                merged_config(tomllib.loads(bad)), None, host.registries.config_sections
            )


# -- JSONL blocks ---------------------------------------------------------------------------

JSONL_LINES = [
    (b.line + 1 + i, line) for b in blocks_of("jsonl") for i, line in enumerate(b.text.splitlines())
]


def test_there_are_jsonl_examples() -> None:
    assert len(JSONL_LINES) >= 4


@pytest.mark.parametrize(("lineno", "line"), JSONL_LINES, ids=[f"line{n}" for n, _ in JSONL_LINES])
def test_jsonl_example_is_accepted(lineno: int, line: str, tmp_path: Path) -> None:
    from hyper_core.data.conversation import parse_conversation

    sample = json.loads(line)
    conversation = parse_conversation(sample, base_dir=tmp_path)
    assert any(m.role == "assistant" for m in conversation.messages)
    # image parts with a path, plus the top-level images that fill <image> placeholders
    expected = line.count('"type": "image"') + len(sample.get("images", []))
    image = sample.get("image")
    expected += len(image) if isinstance(image, list) else 1 if isinstance(image, str) else 0
    assert conversation.num_images == expected, line
    assert all(str(p.path).startswith(str(tmp_path)) for p in conversation.images)


# -- metrics example ------------------------------------------------------------------------


def test_metrics_example_uses_real_keys() -> None:
    sources = "".join(p.read_text() for p in (REPO / "hyper_core" / "trainer").glob("*.py"))
    records = [json.loads(line) for b in blocks_of("json") for line in b.text.splitlines()]
    assert any("loss" in r for r in records) and any("eval" in r for r in records)
    for record in records:
        for key in [*record, *record.get("eval", {})]:
            prefix = key.split("_")[0] + "_{"
            assert f'"{key}"' in sources or f'f"{prefix}' in sources, key


# -- CLI subcommands ------------------------------------------------------------------------


def code_texts() -> list[str]:
    """Text of every fenced block and inline code span."""
    spans = re.findall(r"`([^`]+)`", prose(TEXT))
    return [b.text for b in BLOCKS] + [" ".join(s.split()) for s in spans]


def mentioned_commands() -> list[list[str]]:
    """The arguments of each command line in code that starts with ``hyper-train``, up to a
    comment or shell operator (``pip install hyper-train`` is not one)."""
    found = []
    for text in code_texts():
        # a command line: hyper-train first (after a prompt, env assignments or a venv path)
        line_start = r"^(?:\$ )?(?:[A-Z_]+=\S* )*(?:\S*/)?hyper-train[ \t]+([^\n]*)"
        for m in re.finditer(line_start, text, flags=re.M):
            rest = re.split(r"\s#|&&|\|\||;|\|", m.group(1))[0]
            found.append(shlex.split(rest))
    return found


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


GLOBAL_FLAGS = {"--debug", "--strict-plugins"}


def test_every_mentioned_subcommand_exists(host: Any) -> None:
    from hyper_core.cli.main import build_parser

    parser = build_parser(host.registries.commands)
    seen = set()
    for argv in mentioned_commands():
        while argv and (argv[0] in GLOBAL_FLAGS or argv[0] == "--plugin"):
            argv = argv[2:] if argv[0] == "--plugin" else argv[1:]
        assert argv, "hyper-train without a subcommand"
        command, *args = argv
        choices = subparsers(parser)
        assert command in choices, f"hyper-train {command}: no such subcommand ({sorted(choices)})"
        seen.add(command)
        sub = choices[command]
        for arg in args:
            nested = subparsers(sub)
            if arg in nested:
                sub = nested[arg]
                continue
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and "." not in flag:  # dotted: a config override
                assert flag in sub._option_string_actions, f"hyper-train {command}: no {flag}"
    assert {"run", "plugins", "config", "export", "plot"} <= seen


def test_subcommand_check_catches_mistakes(host: Any) -> None:
    from hyper_core.cli.main import build_parser

    choices = subparsers(build_parser(host.registries.commands))
    assert "train" not in choices and "--nproc" not in choices["run"]._option_string_actions


# -- console transcripts --------------------------------------------------------------------


@attrs.frozen
class Step:
    command: str
    expected: str  # the lines after it, up to the next "$ "


def transcript(block: Block) -> list[Step]:
    steps: list[Step] = []
    command, out = None, []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            if command is not None:
                steps.append(Step(command, "".join(f"{o}\n" for o in out)))
            command, out = line[2:], []
        else:
            assert command is not None, f"line {block.line}: output before a command"
            out.append(line)
    assert command is not None
    steps.append(Step(command, "".join(f"{o}\n" for o in out)))
    return steps


CONSOLE_BLOCKS = blocks_of("console")


def make_workdir(root: Path) -> Path:
    """A folder like the repository root for the commands: configs/ and the fake data dir."""
    work = Path(tempfile.mkdtemp(dir=root))
    (work / "configs").symlink_to(REPO / "configs")
    data = work / "sft"
    data.mkdir()
    lines = (REPO / "configs" / "data" / "text_demo.jsonl").read_text().splitlines()[:16]
    lines[2] = BAD_LINE
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    return work


def run_block(block: Block, root: Path) -> list[tuple[Step, str]]:
    """Run the block's commands in a fresh folder; ``(step, actual output)`` for each."""
    work = make_workdir(root)
    data = str((work / "sft").resolve())
    results: list[tuple[Step, str]] = []
    last_code: int | None = None
    for step in transcript(block):
        if step.command == "echo $?":
            results.append((step, f"{last_code}\n"))
            continue
        argv = shlex.split(step.command.replace(FAKE_DATA_DIR, data))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPER_TRAIN_PLUG")}
        while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
            key, _, value = argv.pop(0).partition("=")
            env[key] = value
        assert argv and argv[0] == "hyper-train", f"line {block.line}: not hyper-train: {argv}"
        proc = subprocess.run(
            [sys.executable, "-m", "hyper_core", *argv[1:]],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        last_code = proc.returncode
        results.append((step, proc.stdout.replace(data, FAKE_DATA_DIR)))
    return results


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[tuple[Step, str]]]:
    root = tmp_path_factory.mktemp("guide")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {b.line: pool.submit(run_block, b, root) for b in CONSOLE_BLOCKS}
        return {line: f.result() for line, f in futures.items()}


def test_there_are_transcripts() -> None:
    commands = [s for b in CONSOLE_BLOCKS for s in transcript(b) if s.command != "echo $?"]
    assert len(commands) >= 20
    troubleshooting = TEXT[TEXT.index("## Troubleshooting") :]
    errors = re.findall(r"^hyper-train: error: ", troubleshooting, flags=re.M)
    assert len(errors) >= 20
    assert BAD_LINE in troubleshooting  # the bad line the test writes is the one shown


@pytest.mark.parametrize("block", CONSOLE_BLOCKS, ids=[f"line{b.line}" for b in CONSOLE_BLOCKS])
def test_console_transcript_is_real(block: Block, transcripts: dict) -> None:
    steps = transcript(block)
    assert any(s.command == "echo $?" for s in steps), "show the exit code"
    for step, actual in transcripts[block.line]:
        assert actual == step.expected, (
            f"docs/user-guide.md line {block.line}: $ {step.command}\n"
            f"--- guide\n{step.expected}--- actual\n{actual}"
        )
    for _, actual in transcripts[block.line]:
        if "hyper-train: error:" in actual:
            assert "Traceback" not in actual


# -- multi-rank failure ---------------------------------------------------------------------


def test_multi_rank_failure_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Launching 2 ranks of a ``strategy = "none"`` config: the strategy's error, as the
    launcher names the first failed rank, and exit code 2."""
    from hyper_core.cli.launch import launcher_exit_code
    from hyper_core.config import ParallelConfig
    from hyper_core.errors import ConfigError
    from hyper_core.parallel.simple import NoParallel

    quoted = re.search(r"^hyper-train: rank 1 \(first\) failed: .*$", TEXT, flags=re.M)
    assert quoted, "the multi-rank failure line is not in the guide"

    class TwoRanks:
        world_size = 2

    with pytest.raises(ConfigError) as info:
        NoParallel(ParallelConfig(), None).apply(None, None, TwoRanks())
    error = f"{type(info.value).__name__}: {info.value}"
    statuses = {
        r: {"rank": r, "local_rank": r, "status": "failed", "error": error, "user_error": True}
        | {"time": t}
        for r, t in ((0, 2.0), (1, 1.0))
    }
    assert launcher_exit_code(1, statuses, 2) == 2
    printed = capsys.readouterr().err.splitlines()
    assert printed[0] == quoted.group(0)
