"""The core's commands as a builtin plugin: each registered through ``register_commands``, the
API plugin commands get (``hyper-train plugins`` lists them under this module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl
from . import commands as core
from .chat import add_chat, cmd_chat
from .predict import add_predict, cmd_predict

if TYPE_CHECKING:
    from ..types import RegisterCommand


@hookimpl
def register_commands(register: RegisterCommand) -> None:
    """run, plugins, config, data, export, chat, predict, plot, new-plugin."""
    register(
        "run",
        core.add_run,
        core.cmd_run,
        help="train from a config",
        description="Train from a TOML config. Extra --section.key=value arguments override it.",
    )
    register(
        "plugins", core.add_plugins, core.cmd_plugins, help="list, install or uninstall plugins"
    )
    register("config", core.add_config, core.cmd_config, help="show or validate a config")
    register(
        "data",
        core.add_data,
        core.cmd_data,
        help="check the training data without training",
        description="stats: read the training samples through the real transform (no model) "
        "and print bad samples, tokens and images per sample, predicted padding and steps "
        "(exit 3 when no sample is usable). show: one sample as the model sees it, its trained "
        "tokens marked, each image as its token count.",
    )
    register(
        "export",
        core.add_export,
        core.cmd_export,
        help="write a checkpoint in the Hugging Face layout",
    )
    register(
        "chat",
        add_chat,
        cmd_chat,
        help="answer prompts with a trained model",
        description="Load a checkpoint, a run's output_dir or an exported model and answer: "
        "once with --prompt, else one line of stdin at a time (/image PATH attaches an image "
        "to the next message, /clear forgets the conversation, exit or EOF ends).",
    )
    register(
        "predict",
        add_predict,
        cmd_predict,
        help="answer every prompt of a test file and score the answers",
        description="Load a checkpoint, a run's output_dir or an export (as chat does, LoRA "
        "included), answer each sample of a .jsonl/.json/.parquet test file (its conversation "
        "before the last assistant turn; that turn is the reference) in batches, write one JSON "
        "line per sample in input order (index, source, prompt, reference, prediction) and print "
        "exact match, token F1 and ROUGE-L.",
    )
    register(
        "plot", core.add_plot, core.cmd_plot, help="draw loss, lr and throughput of a run to a PNG"
    )
    register(
        "new-plugin",
        core.add_new_plugin,
        core.cmd_new_plugin,
        help="scaffold a plugin or model-adapter package",
        description="Write DIR/hyper-train-NAME/: pyproject.toml with the hyper_train.plugins "
        "entry point, the hyper_NAME package, a README and tests using hyper-train's test kit.",
    )
