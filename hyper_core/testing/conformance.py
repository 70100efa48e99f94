"""The adapter conformance suite: what every model adapter must do, checked in one call.

    from hyper_core.testing.conformance import check_adapter

    def test_my_adapter_conforms(tmp_path):
        check_adapter("my_model", "tiny", plugins=["my_pkg.plugin"], workdir=tmp_path)

Each check is a function of an :class:`AdapterUnderTest` (its own module,
:mod:`~hyper_core.testing.conformance_fixture`, re-exported here) in :data:`CHECKS`; it raises
``AssertionError`` with what is wrong. Text adapters (no processor) are held to the text
contract (no vision encoder, image samples rejected); vision-language adapters to the VL one
(odd-sized images, several per sample, per-image encoder, vision FLOPs). Training's ids must be
the saved chat template's (:func:`~hyper_core.testing.conformance_tokens.check_one_pass_tokens`)
and every export must serve stock transformers
(:func:`~hyper_core.testing.conformance_inference.check_stock_inference`);
a check that cannot apply (no stock processor loads) reports ``not applicable`` with the reason.
The 2-rank ``fsdp2`` check runs only with ``distributed=True`` (it launches
``torch.distributed.run``).
For per-check pytest items, subclass
:class:`hyper_core.testing.conformance_suite.AdapterConformance` instead.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .conformance_fixture import AdapterUnderTest
from .conformance_inference import NotApplicable, check_stock_inference
from .conformance_tokens import check_one_pass_tokens

#: Tolerance of the equivalence checks (packed vs padded, export round trip).
ATOL = 1e-5


@attrs.frozen
class CheckResult:
    """The outcome of one check: ``status`` is ``passed``, ``failed``, ``not applicable`` (the
    check cannot apply to this adapter; ``detail`` says why) or ``not run``."""

    name: str
    status: str
    detail: str = ""


@attrs.frozen
class ConformanceReport:
    """Every check's result for one adapter."""

    adapter: str
    results: tuple[CheckResult, ...]

    @property
    def failures(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if r.status == "failed"]

    @property
    def passed(self) -> list[str]:
        """Names of the checks that passed."""
        return [r.name for r in self.results if r.status == "passed"]

    def __str__(self) -> str:
        width = max(len(r.name) for r in self.results)
        lines = [f"conformance of adapter {self.adapter!r}:"]
        for r in self.results:
            lines.append(f"  {r.name:<{width}}  {r.status}" + (f": {r.detail}" if r.detail else ""))
        return "\n".join(lines)


# -- the checks ---------------------------------------------------------------------------------


def check_builds(t: AdapterUnderTest) -> str:
    """Builds on the meta device (for sharding) and on CPU, with the same parameters."""
    meta = t.adapter.build_model(t.model_config(), device="meta")
    devices = {p.device.type for p in meta.parameters()}
    assert devices == {"meta"}, f"build_model(device='meta') put parameters on {devices}"
    model = t.build_model()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes == {n: tuple(p.shape) for n, p in meta.named_parameters()}, (
        "the meta and the CPU model have different parameters"
    )
    bad = [n for n, p in model.named_parameters() if not p.isfinite().all()]
    assert not bad, f"non-finite initial weights: {bad[:3]}"
    return f"{len(shapes)} parameter tensors"


def check_transform(t: AdapterUnderTest) -> str:
    """Samples become tokens with loss tokens; too long is rejected, never truncated; a text
    adapter rejects images, a VL adapter takes odd sizes and several images per sample."""
    from ..data.errors import SampleError

    feats = t.features()
    for i, f in enumerate(feats):
        assert int((f.labels != -100).sum()) > 0, f"sample {i} has no loss tokens"
        assert f.length == f.input_ids.shape[-1] <= t.max_seq_len, f"sample {i}: bad length"
    longest = max(range(len(feats)), key=lambda i: feats[i].length)
    try:
        t.adapter.transform(t.samples[longest], t.assets, max_seq_len=feats[longest].length - 1)
    except SampleError as exc:
        assert exc.reason == "too_long", f"too long a sample raised {exc.reason!r}"
    else:
        raise AssertionError("a sample longer than max_seq_len was not rejected (truncated?)")
    images = [f.num_images for f in feats]
    if not t.is_vision:
        from .vl import vl_samples, write_test_images

        with_image = vl_samples(write_test_images(t.workdir / "images"))[1]
        try:
            t.adapter.transform(with_image, t.assets, max_seq_len=t.max_seq_len)
        except SampleError:
            return "text adapter; image samples rejected"
        raise AssertionError("a text adapter accepted a sample with an image (dropped it?)")
    assert any(n >= 2 for n in images), "the samples need one with several images"
    assert any(n == 0 for n in images), "the samples need one without images"
    return f"images per sample {images}"


def check_train_step(t: AdapterUnderTest) -> str:
    """A packed forward/backward gives a finite loss and finite gradients that reach the
    embeddings, the vision encoder and every trainable parameter but routed experts; one
    optimizer step lowers the loss on that batch."""
    import torch

    from ..adapters.base import routed_expert_parameter_ids

    model = t.build_model()
    mb = t.micro_batch("packed")
    loss = t.loss(model, mb)
    assert torch.isfinite(loss), f"loss is {loss.item()}"
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads, "no parameter received a gradient"
    bad = [n for n, g in grads.items() if not g.isfinite().all()]
    assert not bad, f"non-finite gradients: {bad[:3]}"
    embed = model.get_input_embeddings().weight
    assert embed.grad is not None and embed.grad.abs().sum() > 0, "no gradient at the embeddings"
    experts = routed_expert_parameter_ids(t.adapter, model)  # a small batch need not reach all
    declared = getattr(t.adapter, "unused_parameters", ())
    unused = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad
        and p.grad is None
        and id(p) not in experts
        and not any(fnmatch.fnmatchcase(n, pattern) for pattern in declared)
    ]
    assert not unused, (
        f"trainable parameters that the loss never reaches (an unused head? set it off in the "
        f"model config, or declare it in the adapter's unused_parameters): {unused[:5]}"
        f"{' ...' if len(unused) > 5 else ''}"
    )
    plan = t.adapter.parallel_plan(model)
    if plan.vision_encoder is not None and mb.num_images:
        encoder = model.get_submodule(plan.vision_encoder.module)
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters()), (
            "the vision encoder got no gradient: the pixels don't reach the loss"
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt.step()
    with torch.no_grad():
        after = t.loss(model, mb)
    change = f"{loss.item():.4f} -> {after.item():.4f}"
    assert after < loss, f"one step did not lower the loss ({change})"
    return f"loss {change}"


def check_packed_equals_padded(t: AdapterUnderTest) -> str:
    """Packed and padded micro-batches of the same samples: same loss and gradients (1e-5)."""
    import torch

    model = t.build_model()
    results = {}
    for kind in ("packed", "padded"):
        model.zero_grad(set_to_none=True)
        loss = t.loss(model, t.micro_batch(kind))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[kind] = (loss.item(), grads)
    (packed, pg), (padded, dg) = results["packed"], results["padded"]
    assert abs(packed - padded) <= ATOL, f"loss packed {packed:.7f} vs padded {padded:.7f}"
    assert pg.keys() == dg.keys(), "packed and padded train different parameters"
    worst = max(((pg[n] - dg[n]).abs().max().item(), n) for n in pg)
    for n in pg:
        assert torch.allclose(pg[n], dg[n], atol=ATOL, rtol=1e-4), (
            f"gradient of {n} differs by {worst[0]:.2e} (largest: {worst[1]})"
        )
    return f"|Δloss| {abs(packed - padded):.1e}, max |Δgrad| {worst[0]:.1e}"


def check_label_positions(t: AdapterUnderTest) -> str:
    """Logits at the label positions only (``logits_to_keep``, what training does when the
    adapter sets ``logits_at_labels_only``), with the adapter's :meth:`label_row_modules` run
    on the label rows only, and the chunked cross-entropy on them (LM head per chunk,
    recomputed in backward): the same loss and gradients as logits everywhere (1e-5), packed
    and padded. The label-row modules must write nothing at the other rows."""
    import torch

    from ..step.chunked_loss import chunked_causal_lm_loss, lm_head_returns_hidden
    from ..step.label_positions import keep_label_positions, supports_label_positions
    from ..step.label_rows import install_label_rows

    model = t.build_model()
    if not supports_label_positions(t.adapter, model):
        return "not declared (logits at every position)"
    kwargs = t.adapter.forward_kwargs()
    row_modules = t.adapter.label_row_modules(model)
    install_label_rows(model, row_modules)
    outputs: dict[str, torch.Tensor] = {}
    for name in row_modules:
        model.get_submodule(name).register_forward_hook(
            lambda _m, _i, out, name=name: outputs.__setitem__(name, out.detach())
        )

    def chunked(mb: Any) -> Any:
        with lm_head_returns_hidden(model) as head:
            hidden = model(**mb.model_inputs, **kwargs).logits
        labels = mb.loss_inputs["labels"]
        return chunked_causal_lm_loss(hidden, head, labels, float(mb.num_loss_tokens), 5)

    worst = 0.0
    for kind in ("packed", "padded"):
        mb = t.micro_batch(kind)
        only = keep_label_positions(mb)
        results = {}
        for name in ("every position", "label positions", "chunked"):
            model.zero_grad(set_to_none=True)
            if name == "chunked":
                loss = chunked(only)
            else:
                loss = t.loss(model, mb if name == "every position" else only)
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results[name] = (loss.item(), grads)
            if name == "label positions":
                others = ~only.loss_inputs["label_mask"]
                for module, out in outputs.items():
                    assert out.shape[:2] == others.shape, f"{module}: output {tuple(out.shape)}"
                    assert not out[others].any(), f"{module} ran on rows without a label"
        full, fg = results.pop("every position")
        for name, (value, grads) in results.items():
            assert abs(full - value) <= ATOL, f"{kind}, {name}: loss {value:.7f} vs {full:.7f}"
            assert fg.keys() == grads.keys(), f"{kind}, {name}: other parameters get gradients"
            for n in fg:
                diff = (fg[n] - grads[n]).abs().max().item()
                worst = max(worst, diff)
                bound = ATOL + 1e-4 * fg[n].abs().max().item()
                assert diff <= bound, f"{kind}, {name}: gradient of {n} differs by {diff:.1e}"
    return f"max |Δgrad| {worst:.1e}; label-row modules: {len(row_modules)}"


def check_parallel_plan(t: AdapterUnderTest) -> str:
    """Every sharding-unit pattern and freeze group names modules that exist."""
    from ..adapters.hf import match_modules

    model = t.build_model()
    plan = t.adapter.parallel_plan(model)
    assert plan.sharding_units, "the plan has no sharding units"
    for pattern in plan.sharding_units:
        assert match_modules(model, (pattern,)), f"sharding unit {pattern!r} matches no module"
    units = match_modules(model, plan.sharding_units)
    for group, paths in t.adapter.freeze_groups(model).items():
        for path in paths:
            try:
                model.get_submodule(path)
            except AttributeError as exc:
                raise AssertionError(f"freeze group {group!r}: no module {path!r}") from exc
    if plan.vision_encoder is not None:
        model.get_submodule(plan.vision_encoder.module)
    return f"{len(units)} units"


def check_vision_encoder(t: AdapterUnderTest) -> str:
    """VL: the declared encoder runs per image as on the whole batch (encoder parallelism),
    the model given the injected features computes the loss it computes from the pixels, and
    a vision filler exists; text: no encoder and no filler are declared."""
    import torch

    from ..adapters.vision_context import VisionContext

    model = t.build_model()
    plan = t.adapter.parallel_plan(model)
    if not t.is_vision:
        assert plan.vision_encoder is None, "a text adapter declares a vision encoder"
        assert t.adapter.vision_filler(t.assets) is None, "a text adapter has a vision filler"
        return "text adapter; none declared"
    assert plan.vision_encoder is not None, "a VL adapter must declare its vision encoder"
    filler = t.adapter.vision_filler(t.assets)
    assert filler is not None and filler.num_images == 1, "vision_filler must give one image"
    assert int((filler.labels != -100).sum()) == 0, "the vision filler must have no loss tokens"
    mb = t.micro_batch("packed")
    context = VisionContext.of(mb, model.config)
    missing = set(plan.vision_encoder.meta_keys) - set(context.image_meta)
    assert not missing, f"the micro-batch carries no image_meta {sorted(missing)}"
    parts = t.adapter.split_vision_inputs(mb.model_inputs, context)
    assert len(parts) == mb.num_images, f"{len(parts)} per-image inputs for {mb.num_images} images"
    model.eval()
    with torch.no_grad():
        outputs = t.adapter.call_vision_encoder(model, mb.model_inputs, context)
        whole = outputs.pooler_output
        single = [
            t.adapter.call_vision_encoder(model, p, context.take([i])).pooler_output[0]
            for i, p in enumerate(parts)
        ]
        assert len(whole) == len(single)
        for i, (a, b) in enumerate(zip(whole, single)):
            assert a.shape == b.shape and torch.allclose(a, b, atol=ATOL), f"image {i} differs"
        from_pixels = t.loss(model, mb)
        injected = t.adapter.inject_vision_outputs(mb.model_inputs, outputs, context)
        keys = set(plan.vision_encoder.input_keys[:1])
        assert not keys & set(injected), "inject_vision_outputs left the pixels in"
        from_features = t.loss(model, attrs.evolve(mb, model_inputs=injected))
    diff = abs(from_pixels.item() - from_features.item())
    assert diff <= ATOL, f"loss with injected features differs from the pixels' by {diff:.2e}"
    return f"{len(parts)} images, per-image = whole, injected = pixels"


def check_flops(t: AdapterUnderTest) -> str:
    """FLOPs are positive, grow with tokens, and count vision work for images (only then)."""
    model = t.build_model()
    feats = t.features()
    order = sorted(range(len(feats)), key=lambda i: feats[i].num_images)
    fewest = t.adapter.flops(model, t.micro_batch("packed", [feats[order[0]]]))
    full = t.adapter.flops(model, t.micro_batch("packed", feats))
    assert fewest.text > 0, "text FLOPs must be positive"
    assert full.text > fewest.text, "text FLOPs don't grow with the tokens"
    assert full.total == full.text + full.vision
    if t.is_vision:
        assert feats[order[0]].num_images > 0 or fewest.vision == 0, "vision FLOPs without images"
        assert full.vision > 0, "no vision FLOPs for a micro-batch with images"
    else:
        assert full.vision == 0, "a text adapter counts vision FLOPs"
    return f"text {full.text:.3g}, vision {full.vision:.3g}"


def check_export_roundtrip(t: AdapterUnderTest) -> str:
    """``export_hf`` (streamed through ``checkpoint_layout``, one export group at a time)
    writes a directory that ``from_pretrained`` and the adapter load back to the same logits
    (1e-5); converting group by group gives what converting the whole state dict gives."""
    import torch

    from ..export import group_keys

    model = t.build_model()
    with torch.no_grad():  # weights unlike any init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    state = model.state_dict()
    layout = t.adapter.checkpoint_layout(model.config)
    whole = layout.convert(dict(state))
    grouped: dict[str, torch.Tensor] = {}
    for keys in group_keys(state):
        part = layout.convert({k: state[k] for k in keys})
        assert not part.keys() & grouped.keys(), f"names written twice: {part.keys() & grouped}"
        grouped.update(part)
    assert grouped.keys() == whole.keys(), "a conversion needs tensors of another export group"
    for name, tensor in whole.items():
        assert torch.equal(grouped[name], tensor), f"{name} differs converted by group"
    out = t.workdir / "export"
    t.adapter.export_hf(model.state_dict(), model.config, out, assets=t.assets)
    assert list(out.glob("*.safetensors")), "export wrote no safetensors"
    assert (out / "config.json").is_file(), "export wrote no config.json"
    mb = t.micro_batch("padded")
    reloaded = {
        "from_pretrained": type(model).from_pretrained(str(out), local_files_only=True),
        "adapter": t.adapter.build_model(t.model_config(path=str(out), config=None)),
    }
    model.eval()
    with torch.no_grad():
        expected = model(**mb.model_inputs, **t.adapter.forward_kwargs()).logits
        for how, other in reloaded.items():
            other.eval()
            got = other(**mb.model_inputs, **t.adapter.forward_kwargs()).logits
            diff = (got - expected).abs().max().item()
            assert diff <= ATOL, f"logits after export ({how}) differ by {diff:.2e}"
    t.adapter.build_assets(t.model_config(path=str(out), config=None))
    return f"{len(list(out.glob('*.safetensors')))} safetensors file(s)"


def _training_config(t: AdapterUnderTest, out: Path, data: Path, **parallel: Any) -> dict:
    base = {"config": t.tiny_config} if isinstance(t.tiny_config, str) else dict(t.tiny_config)
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"adapter": t.name, **base},
        "data": {"train": str(data), "max_seq_len": t.max_seq_len, "shuffle": False},
        "training": {
            "steps": 2,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1e-3,
            "warmup_steps": 0,
        },
        "parallel": {"timeout_s": 120, **parallel},
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
    }


def _losses(out: Path) -> dict[int, float]:
    from . import read_metrics

    return {int(m["step"]): float(m["loss"]) for m in read_metrics(out) if "loss" in m}


def check_two_rank_fsdp2(t: AdapterUnderTest) -> str:
    """Two ``fsdp2`` ranks (gloo on CPU) train the same losses as one rank (1e-4)."""
    from . import run_tiny_training

    root = t.workdir / "distributed"
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data.jsonl"
    rows = []
    for s in t.samples * 3:
        row = copy.deepcopy({k: v for k, v in s.items() if k != "_source"})
        rows.append(json.dumps(_absolute_images(row, s)))
    data.write_text("\n".join(rows) + "\n")
    one = _training_config(t, root / "one-rank", data)
    run_tiny_training(one, host=t.host)
    two = _training_config(t, root / "two-ranks", data, strategy="fsdp2")
    config_file = root / "two-ranks.json"
    config_file.write_text(json.dumps({"config": two, "plugins": _plugin_names(t.plugins)}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "hyper_core.testing._conformance_worker", str(config_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_", "WORLD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"2-rank fsdp2 run failed:\n{proc.stderr[-3000:]}"
    a, b = _losses(root / "one-rank"), _losses(root / "two-ranks")
    assert a.keys() == b.keys() == {1, 2}, f"steps logged: 1 rank {sorted(a)}, 2 ranks {sorted(b)}"
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-4, f"step {step}: 1 rank {a[step]} vs 2 {b[step]}"
    return f"losses {[round(b[s], 5) for s in sorted(b)]}"


def _absolute_images(row: dict[str, Any], sample: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with image paths made absolute against the sample's source file."""
    source = sample.get("_source", {}).get("file")
    if not source:
        return row
    base = Path(source).parent

    def fix(path: str) -> str:
        return path if os.path.isabs(path) else str(base / path)

    if isinstance(row.get("images"), list):
        row["images"] = [fix(p) for p in row["images"]]
    for message in row.get("messages", []):
        if isinstance(message.get("content"), list):
            for part in message["content"]:
                if part.get("type") == "image" and isinstance(part.get("image"), str):
                    part["image"] = fix(part["image"])
    return row


def _plugin_names(plugins: Sequence[Any]) -> list[str]:
    names = []
    for p in plugins:
        if not isinstance(p, str):
            raise TypeError("the distributed check needs plugins as importable module names")
        names.append(p)
    return names


#: The checks, in the order they run.
CHECKS: dict[str, Callable[[AdapterUnderTest], str]] = {
    "builds": check_builds,
    "transform": check_transform,
    "train_step": check_train_step,
    "packed_equals_padded": check_packed_equals_padded,
    "label_positions": check_label_positions,
    "parallel_plan": check_parallel_plan,
    "vision_encoder": check_vision_encoder,
    "flops": check_flops,
    "export_roundtrip": check_export_roundtrip,
    "one_pass_tokens": check_one_pass_tokens,
    "stock_inference": check_stock_inference,
    "two_rank_fsdp2": check_two_rank_fsdp2,
}
#: Checks that run only when asked for (``distributed=True``).
DISTRIBUTED_CHECKS = ("two_rank_fsdp2",)


def check_adapter(
    name: str,
    tiny_config: str | Mapping[str, Any] = "tiny",
    sample_data: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None = None,
    *,
    plugins: Iterable[Any] = (),
    distributed: bool = False,
    workdir: str | os.PathLike[str] | None = None,
    raise_on_failure: bool = True,
    extra_checks: Mapping[str, Callable[[AdapterUnderTest], str]] | None = None,
) -> ConformanceReport:
    """Run every conformance check on adapter ``name``; raise ``AssertionError`` listing the
    failed ones (with ``raise_on_failure``), else return the report.

    ``tiny_config`` is the adapter's named config (``"tiny"``) or ``[model]`` keys;
    ``sample_data`` a JSONL path or raw samples (default: the kit's 0/1/2-image samples for a
    VL adapter, three chats for a text one); ``plugins`` the plugin modules or objects to load
    (default: every installed plugin); ``extra_checks`` more checks of the same form, run after
    these (e.g. ``hyper_peft.conformance.LORA_CHECKS``: the adapter with LoRA).
    """
    subject = AdapterUnderTest(name, tiny_config, sample_data, plugins=plugins, workdir=workdir)
    results = []
    for check, fn in {**CHECKS, **(extra_checks or {})}.items():
        if check in DISTRIBUTED_CHECKS and not distributed:
            results.append(CheckResult(check, "not run", "distributed=False"))
            continue
        try:
            results.append(CheckResult(check, "passed", fn(subject)))
        except NotApplicable as exc:
            results.append(CheckResult(check, "not applicable", str(exc)))
        except Exception as exc:  # a check's error is that check's failure, reported with it
            results.append(CheckResult(check, "failed", f"{type(exc).__name__}: {exc}"))
    report = ConformanceReport(name, tuple(results))
    if raise_on_failure and report.failures:
        raise AssertionError(str(report))
    return report


__all__ = [
    "CHECKS",
    "AdapterUnderTest",
    "CheckResult",
    "ConformanceReport",
    "NotApplicable",
    "check_adapter",
    "check_one_pass_tokens",
    "check_stock_inference",
]
