"""Generate ``docs/hooks.md`` and ``docs/configuration.md`` from the code.

``python -m hyper_core.docgen`` rewrites both; a test fails when they are stale. The hook
reference comes from the hookspec docstrings, the config reference from the attrs metadata.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import attrs

from . import hookspecs

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: A short, realistic implementation per hook (completed below with the ``Example::`` blocks of
#: the hookspec docstrings). tests/core/test_hook_examples.py runs each in a tiny run (free names
#: such as ``COUNTER`` get stand-ins there).
EXAMPLES: dict[str, str] = {
    "register_batching_runtimes": (
        "@hookimpl\ndef register_batching_runtimes(register):\n"
        '    register("sorted_padded", "my_pkg.batching:SortedPaddedRuntime")'
    ),
    "register_parallel_strategies": (
        "@hookimpl\ndef register_parallel_strategies(register):\n"
        '    register("encoder_parallel", "hyper_encoder_parallel.strategy:EncoderParallel")'
    ),
    "register_commands": (
        "@hookimpl\ndef register_commands(register):\n"
        "    def add_arguments(parser):\n"
        '        parser.add_argument("output_dir")\n'
        "    def run(args):\n"
        "        print(args.output_dir)\n"
        "        return 0\n"
        '    register("where", add_arguments, run, help="print a run directory")'
    ),
    "setup_distributed": (
        "@hookimpl(wrapper=True)\ndef setup_distributed(config):\n"
        "    dist = yield\n"
        '    print(f"rank {dist.rank} of {dist.world_size} on {dist.device}")\n'
        "    return dist"
    ),
    "build_loss": (
        "@hookimpl\ndef build_loss(config, adapter):\n"
        "    def loss_fn(outputs, loss_inputs, num_loss_tokens):\n"
        '        labels = loss_inputs["labels"]\n'
        "        nll = torch.nn.functional.cross_entropy(\n"
        '            outputs.logits.flatten(0, -2).float(), labels.flatten(), reduction="sum")\n'
        "        return nll / num_loss_tokens, {}\n"
        "    return loss_fn"
    ),
    "build_model_assets": (
        "@hookimpl(wrapper=True)\ndef build_model_assets(config, adapter):\n"
        "    assets = yield\n"
        '    assets.tokenizer.padding_side = "left"\n'
        "    return assets"
    ),
    "build_data_transform": (
        "@hookimpl(wrapper=True)\ndef build_data_transform(config, adapter, assets):\n"
        "    transform = yield\n"
        "    def without_system_turns(sample):\n"
        '        messages = [m for m in sample["messages"] if m["role"] != "system"]\n'
        '        return transform({**sample, "messages": messages})\n'
        "    return without_system_turns"
    ),
    "build_dataset": (
        "@hookimpl(wrapper=True)\ndef build_dataset(config, transform, dist, registries):\n"
        "    splits = yield\n"
        '    print(f"{len(splits.train)} training samples")\n'
        "    return splits"
    ),
    "build_collate_fn": (
        "@hookimpl(wrapper=True)\ndef build_collate_fn(config, runtime, assets):\n"
        "    collate = yield\n"
        "    return lambda features: collate(sorted(features, key=lambda f: f.length))"
    ),
    "build_dataloader": (
        "@hookimpl(wrapper=True)\ndef build_dataloader(config, datasets, collate_fn, dist):\n"
        "    loaders = yield\n"
        '    print(f"{loaders.train.steps_per_epoch} steps per epoch")\n'
        "    return loaders"
    ),
    "build_get_batch": (
        "@hookimpl(wrapper=True)\ndef build_get_batch(config, runtime, dist):\n"
        "    get_batch = yield\n"
        "    def get_batch_bf16(micro_batch):\n"
        "        model_inputs, loss_inputs = get_batch(micro_batch)\n"
        '        if "pixel_values" in model_inputs:\n'
        '            model_inputs["pixel_values"] = model_inputs["pixel_values"].bfloat16()\n'
        "        return model_inputs, loss_inputs\n"
        "    return get_batch_bf16"
    ),
    "compute_train_iters": (
        "@hookimpl\ndef compute_train_iters(config, dataloaders, dist):\n"
        "    return min(config.training.steps or 10**9, 2 * dataloaders.train.steps_per_epoch)"
    ),
    "build_optimizer": (
        "@hookimpl\ndef build_optimizer(config, model):\n"
        "    return torch.optim.SGD(model.parameters(), lr=config.training.lr, momentum=0.9)"
    ),
    "build_lr_scheduler": (
        "@hookimpl\ndef build_lr_scheduler(config, optimizer, train_iters):\n"
        "    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, train_iters // 3))"
    ),
    "build_training_context": (
        "@hookimpl\ndef build_training_context(config, model, dist):\n"
        "    return lambda: torch.autocast(dist.device.type, dtype=torch.float16)"
    ),
    "build_evaluator": (
        "@hookimpl(wrapper=True)\ndef build_evaluator(config, dist):\n"
        "    evaluator = yield\n"
        "    class WithBestLoss:\n"
        '        best = float("inf")\n'
        "        def evaluate(self):\n"
        "            metrics = evaluator.evaluate()\n"
        '            self.best = min(self.best, metrics["eval_loss"])\n'
        '            metrics["best_eval_loss"] = self.best\n'
        "            return metrics\n"
        "    return WithBestLoss()"
    ),
    "build_checkpointer": (
        "@hookimpl(wrapper=True)\ndef build_checkpointer(config, dist, model, optimizer,\n"
        "                       lr_scheduler, dataloaders):\n"
        "    checkpointer = yield\n"
        '    print(f"checkpoints go to {checkpointer.root}")\n'
        "    return checkpointer"
    ),
    "on_stage_end": (
        "@hookimpl\ndef on_stage_end(stage, result, trainer):\n"
        '    if stage == "build_model":\n'
        '        print(sum(p.numel() for p in result.parameters()), "parameters")'
    ),
    "on_train_begin": (
        "@hookimpl\ndef on_train_begin(trainer, state):\n"
        '    print(f"training {trainer.train_iters} steps from step {state.global_step}")'
    ),
    "on_epoch_begin": (
        '@hookimpl\ndef on_epoch_begin(trainer, state, epoch):\n    print(f"epoch {epoch}")'
    ),
    "on_step_begin": (
        "@hookimpl\ndef on_step_begin(trainer, state, micro_batches):\n"
        "    images = sum(mb.num_images for mb in micro_batches)\n"
        '    print(f"step {state.global_step + 1}: {images} images")'
    ),
    "on_micro_step_end": (
        "@hookimpl\ndef on_micro_step_end(trainer, state, micro_step, loss):\n"
        '    assert torch.isfinite(loss), f"non-finite loss in micro-step {micro_step}"'
    ),
    "on_step_end": (
        "@hookimpl\ndef on_step_end(trainer, state, loss, loss_dict, grad_norm):\n"
        "    if grad_norm is not None and grad_norm > 100:\n"
        '        print(f"step {state.global_step}: grad norm {grad_norm:.1f}")'
    ),
    "on_log": (
        "@hookimpl\ndef on_log(trainer, state, metrics):\n"
        '    metrics["lr_x1000"] = metrics["lr"] * 1000  # written to metrics.jsonl'
    ),
    "on_evaluate": (
        "@hookimpl\ndef on_evaluate(trainer, state, metrics):\n"
        '    print("eval loss", metrics["eval_loss"])'
    ),
    "on_save_checkpoint": (
        "@hookimpl\ndef on_save_checkpoint(trainer, state, plugin_state):\n"
        '    plugin_state["my_plugin"] = {"seen_images": COUNTER.value}'
    ),
    "on_load_checkpoint": (
        "@hookimpl\ndef on_load_checkpoint(trainer, state, plugin_state):\n"
        '    COUNTER.value = plugin_state.get("my_plugin", {}).get("seen_images", 0)'
    ),
    "on_epoch_end": (
        "@hookimpl\ndef on_epoch_end(trainer, state, epoch):\n"
        '    print(f"epoch {epoch} done at step {state.global_step}")'
    ),
    "on_train_end": (
        "@hookimpl\ndef on_train_end(trainer, state):\n"
        '    print(f"finished after {state.global_step} steps")'
    ),
    "on_train_error": (
        "@hookimpl\ndef on_train_error(trainer, state, exc):\n"
        "    dump_debug_state(trainer, reason=repr(exc))  # the error still propagates"
    ),
}


def docstring_example(name: str) -> str | None:
    """The ``Example::`` block of hook ``name``'s docstring, if it has one."""
    doc = inspect.cleandoc(getattr(hookspecs, name).__doc__ or "")
    _, found, rest = doc.partition("Example::\n")
    return textwrap.dedent(rest).strip() if found else None


for _name in (
    hookspecs.REGISTRATION_HOOKS
    + hookspecs.BUILD_STAGES
    + hookspecs.LIFECYCLE_EVENTS
    + hookspecs.COMMAND_HOOKS
):
    _example = docstring_example(_name)
    if _example is not None:  # the docstring's example is the one shown
        EXAMPLES[_name] = _example

_SECTIONS = (
    (
        "Registration hooks",
        hookspecs.REGISTRATION_HOOKS,
        "Called once per process when plugins load. Cheap; no torch imports.",
    ),
    (
        "Build stages",
        hookspecs.BUILD_STAGES,
        "Called once per run in this order; `firstresult` (the first non-None result wins; the "
        "core's default runs last). Wrap one with `@hookimpl(wrapper=True)`.",
    ),
    (
        "Lifecycle events",
        hookspecs.LIFECYCLE_EVENTS,
        "Every implementation runs; return values are ignored.",
    ),
    (
        "Command hooks",
        hookspecs.COMMAND_HOOKS,
        "Called by a `hyper-train` subcommand, outside a run; `firstresult` (the first non-None "
        "result wins; the core's behaviour when there is none).",
    ),
)


def _signature(fn: Any) -> str:
    """``name(param: Type, ...) -> Result`` as written in the hookspec (annotations unevaluated)."""
    sig = inspect.signature(fn)
    params = ", ".join(
        name if p.annotation is p.empty else f"{name}: {p.annotation}"
        for name, p in sig.parameters.items()
    )
    result = "" if sig.return_annotation is sig.empty else f" -> {sig.return_annotation}"
    return f"{fn.__name__}({params}){result}"


def example_of(name: str) -> str | None:
    """The example shown for hook ``name`` (:data:`EXAMPLES`' entry), or None."""
    return EXAMPLES.get(name)


def render_hooks() -> str:
    """The text of ``docs/hooks.md``."""
    out = [
        "# Hook reference",
        "",
        "<!-- generated by `python -m hyper_core.docgen`; edit hyper_core/hookspecs.py -->",
        "",
        textwrap.dedent(hookspecs.__doc__ or "").strip(),
        "",
        "Implement hooks with `from hyper_core import hookimpl`; an implementation may accept",
        "any subset of a hook's parameters.",
        "",
    ]
    for title, names, blurb in _SECTIONS:
        out += [f"## {title}", "", blurb, ""]
        for name in names:
            fn = getattr(hookspecs, name)
            out += [f"### `{_signature(fn)}`", ""]
            out += [inspect.cleandoc(fn.__doc__ or ""), ""]
            example = EXAMPLES.get(name)
            if example and docstring_example(name) is None:  # else the docstring shows it
                out += ["```python", example, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _type_name(tp: Any) -> str:
    text = str(tp) if not isinstance(tp, type) else tp.__name__
    for prefix in ("typing.", "hyper_core.config.schema."):
        text = text.replace(prefix, "")
    return text.replace("NoneType", "None")


def _default(field: attrs.Attribute) -> str:
    if field.default is attrs.NOTHING:
        return "required"
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        value = field.default.factory()
        return f"`{value!r}`"
    if field.default is None:
        return "unset"
    return f"`{field.default!r}`"


def render_configuration() -> str:
    """The text of ``docs/configuration.md``."""
    from .config import schema

    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m hyper_core.docgen`; edit hyper_core/config/schema.py -->",
        "",
        "A run is one TOML file. Every key is checked strictly: wrong types, unknown keys and",
        "missing required keys are errors naming their `$.path` (all problems at once, exit 2).",
        "Override any key on the command line: `hyper-train run cfg.toml --training.lr=1e-4`",
        "(values are parsed as TOML). Plugins add their own sections",
        "(`register_config_sections`); see their READMEs. Components are chosen by registered",
        "name, never by import path.",
        "",
    ]
    for name in schema.CORE_SECTIONS:
        cls = attrs.fields_dict(schema.Config)[name].type
        if isinstance(cls, str):
            cls = getattr(schema, cls.split("|")[0].strip())
        hints = typing.get_type_hints(cls)
        out += [f"## `[{name}]`", "", textwrap.dedent(cls.__doc__ or "").strip(), ""]
        out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for field in attrs.fields(cls):
            if field.metadata.get("toml") is False:
                continue
            key = field.metadata.get("key", field.name)
            help_text = field.metadata.get("help", "").replace("|", "\\|")
            tp = _type_name(hints.get(field.name, field.type)).replace("|", "\\|")
            out.append(f"| `{key}` | `{tp}` | {_default(field)} | {help_text} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


GENERATED = {"hooks.md": render_hooks, "configuration.md": render_configuration}


def main() -> int:
    """Rewrite the generated pages."""
    DOCS.mkdir(exist_ok=True)
    for name, render in GENERATED.items():
        (DOCS / name).write_text(render())
        print(f"wrote docs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
