"""The conformance check that an export serves stock transformers: ``AutoProcessor`` and
``AutoModelForImageTextToText`` (``AutoTokenizer`` and ``AutoModelForCausalLM`` for a text
model) load it, the saved chat template reproduces training's text, the processor gives
training's ids and pixels, and ``generate`` runs on one image sample.

It is :data:`hyper_core.testing.conformance.CHECKS` ``["stock_inference"]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .conformance_fixture import AdapterUnderTest

#: Tokens ``generate`` is asked for.
NEW_TOKENS = 3


class NotApplicable(Exception):
    """A check that does not apply to this adapter (the message says why)."""


#: Optional packages of transformers' processors (name -> module): an error naming one that
#: cannot be imported means the stock processor lacks it, whatever the exception's type (some
#: families raise ``ValueError`` when their video processor needs torchvision).
OPTIONAL_PACKAGES: dict[str, str] = {
    "torchvision": "torchvision",
    "torchcodec": "torchcodec",
    "av": "av",
    "pyav": "av",
    "decord": "decord",
    "opencv": "cv2",
    "cv2": "cv2",
    "timm": "timm",
    "librosa": "librosa",
    "soundfile": "soundfile",
    "torchaudio": "torchaudio",
    "scipy": "scipy",
    "sentencepiece": "sentencepiece",
    "protobuf": "google.protobuf",
    "pytesseract": "pytesseract",
    "num2words": "num2words",
    "einops": "einops",
}


def _importable(name: str) -> bool:
    import importlib

    try:
        importlib.import_module(name)
    except Exception:  # absent, or installed but broken (torchvision against another torch)
        return False
    return True


def missing_packages(exc: BaseException) -> list[str]:
    """The optional packages ``exc``'s message names that cannot be imported."""
    import re

    text = str(exc).lower()
    named = [p for p in OPTIONAL_PACKAGES if re.search(rf"\b{re.escape(p)}\b", text)]
    return [p for p in named if not _importable(OPTIONAL_PACKAGES[p])]


def _missing_backend(exc: Exception) -> bool:
    """Whether transformers refused for want of an optional package (e.g. torchvision)."""
    if isinstance(exc, ImportError) or "Missing optional dependencies" in str(exc):
        return True
    return bool(missing_packages(exc))


def model_inputs(model: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``inputs`` that ``model.generate`` takes: named parameters of the model's
    ``forward`` or ``prepare_inputs_for_generation``. A processor's metadata (e.g. crop
    counts) is dropped: ``generate`` rejects keys the model does not take."""
    import inspect

    names: set[str] = set()
    for fn in (model.forward, getattr(model, "prepare_inputs_for_generation", None)):
        if fn is None:
            continue
        params = inspect.signature(fn).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return {k: v for k, v in inputs.items() if k in names}


def _first_line(exc: Exception) -> str:
    """The sentence of the error that names what is missing, else its first sentence."""
    sentences = [x.strip().rstrip(".") for x in str(exc).replace("\n", " ").split(". ")]
    named = [x for x in sentences if x.startswith("Missing optional dependencies")]
    return (named or [x for x in sentences if x] or [repr(exc)])[0]


def _one_image_sample(t: AdapterUnderTest) -> Mapping[str, Any]:
    from ..data.conversation import parse_conversation

    if not t.is_vision:
        return t.samples[0]
    counts = [parse_conversation(s).num_images for s in t.samples]
    with_images = [i for i, n in enumerate(counts) if n]
    assert with_images, "the samples need one with an image"
    return t.samples[next((i for i in with_images if counts[i] == 1), with_images[0])]


def _same_ids(what: str, got: Sequence[int], expected: Sequence[int], tokenizer: Any) -> None:
    from .conformance_tokens import describe_difference

    diff = describe_difference(got, expected, tokenizer, ("stock", "training"))
    if diff:
        raise AssertionError(f"{what}: stock ids differ from training's {diff}")


def _stock_model(out: Path, fallback: type, vision: bool) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    try:
        return auto.from_pretrained(str(out), local_files_only=True)
    except ValueError:  # the class is not registered with that auto class
        return fallback.from_pretrained(str(out), local_files_only=True)


def check_stock_inference(t: AdapterUnderTest) -> str:
    """The export serves stock transformers: ``AutoProcessor.from_pretrained`` (for a VL
    model) or ``AutoTokenizer``; the saved chat template renders the conversation and the
    prompt (with the generation prompt) to exactly training's ids, the processor's pixels
    equal training's, and the model class's ``from_pretrained`` + ``generate`` run on one image
    sample, given only the processor outputs the model takes. Where AutoProcessor needs a
    package that is missing (torchvision for Qwen-VL's video processor: any exception whose
    message names a missing optional package), the tokenizer and ``AutoImageProcessor``
    stand in, expanding images as training does (``generate`` then checks the count); not
    applicable where neither loads."""
    import torch
    from transformers import AutoTokenizer, ProcessorMixin

    from ..data.conversation import load_images, parse_conversation

    model = t.build_model()
    out = t.workdir / "stock-export"
    t.adapter.export_hf(model.state_dict(), model.config, out, assets=t.assets)
    sample = _one_image_sample(t)
    conversation = parse_conversation(sample)
    prompt, _ = conversation.prompt_and_answer()
    images = load_images(conversation)
    trained = t.adapter.transform(sample, t.assets, max_seq_len=t.max_seq_len)
    expected_prompt = t.adapter.generation_prompt(prompt, t.assets).features.input_ids

    how = "AutoTokenizer"
    processor: Any = None
    if t.is_vision:
        from transformers import AutoProcessor

        how = "AutoProcessor"
        try:
            processor = AutoProcessor.from_pretrained(str(out), local_files_only=True)
        except Exception as exc:  # transformers raises ImportError or ValueError
            if not _missing_backend(exc):
                raise
            how = f"AutoTokenizer + AutoImageProcessor (AutoProcessor: {_first_line(exc)})"
            processor = _FallbackProcessor.load(out, t.assets.processor, exc)
        else:
            if not isinstance(processor, ProcessorMixin):
                _no_stock_processor(out, processor)
        tokenizer = processor.tokenizer
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tokenizer.chat_template, "the export has no chat template"

    def encode(messages: list[dict[str, Any]], *, generation: bool) -> Any:
        text = (processor or tokenizer).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation
        )
        if processor is None:
            return tokenizer([text], add_special_tokens=False, return_tensors="pt")
        return processor(text=[text], images=images or None, return_tensors="pt")

    full = encode(conversation.to_messages(), generation=False)
    _same_ids("the conversation", full["input_ids"][0].tolist(), trained.input_ids, tokenizer)
    inputs = encode(prompt.to_messages(), generation=True)
    _same_ids(
        "the prompt (generation prompt added)",
        inputs["input_ids"][0].tolist(),
        expected_prompt.tolist(),
        tokenizer,
    )
    for key, value in (trained.media or {}).items():
        assert key in inputs, f"the stock processor gives no {key!r}"
        stock = inputs[key]
        assert tuple(stock.shape) == tuple(value.shape), (
            f"{key}: stock shape {tuple(stock.shape)} vs training {tuple(value.shape)}"
        )
        diff = (stock.float() - value.float()).abs().max().item() if value.numel() else 0.0
        assert diff <= 1e-4, f"{key}: stock and training values differ by {diff:.2e}"

    stock_model = _stock_model(out, type(model), t.is_vision)
    stock_model.eval()
    with torch.no_grad():
        generated = stock_model.generate(
            **model_inputs(stock_model, inputs),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=t.assets.pad_token_id,
        )
    length = inputs["input_ids"].shape[1]
    assert length < generated.shape[1] <= length + NEW_TOKENS, "generate added no tokens"
    return f"{how}; {type(stock_model).__name__}.generate on {len(images)} image(s)"


def _no_stock_processor(out: Path, loaded: Any) -> None:
    """AutoProcessor fell back to a tokenizer or image processor: not applicable when
    transformers has no processor for the model type and the export names none."""
    import json

    from ..adapters.processor import PROCESSOR_CONFIG_FILE

    named = out / PROCESSOR_CONFIG_FILE
    assert not named.is_file(), (
        f"AutoProcessor loads the export as a {type(loaded).__name__}, not the processor that "
        f"{PROCESSOR_CONFIG_FILE} names"
    )
    model_type = json.loads((out / "config.json").read_text()).get("model_type")
    raise NotApplicable(
        f"transformers has no processor for model type {model_type!r} (AutoProcessor gives a "
        f"{type(loaded).__name__}) and the adapter's processor names none (processor_class)"
    )


class _FallbackProcessor:
    """The stock tokenizer and ``AutoImageProcessor``, images expanded as in training: the
    user guide's recipe where ``AutoProcessor`` needs a missing package."""

    def __init__(self, tokenizer: Any, image_processor: Any, trained: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.trained = trained

    @classmethod
    def load(cls, out: Path, trained: Any, why: Exception) -> _FallbackProcessor:
        from transformers import AutoImageProcessor, AutoTokenizer

        try:
            image_processor = AutoImageProcessor.from_pretrained(str(out), local_files_only=True)
        except Exception as exc:  # transformers raises ImportError or ValueError
            if not _missing_backend(exc):
                raise
            reasons = dict.fromkeys((_first_line(why), _first_line(exc)))
            raise NotApplicable(
                "transformers' processor for this model needs a package that is not installed: "
                + "; ".join(reasons)
            ) from None
        tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
        return cls(tokenizer, image_processor, trained)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(self, *, text: list[str], images: Any, return_tensors: str) -> dict[str, Any]:
        vision = dict(self.image_processor(images=images, return_tensors=return_tensors))
        counts = self.trained.image_token_counts(vision) if images else []
        # Each image's metadata (a crop count, a tile grid) as training reads it: a stock image
        # processor may not return every key the trained processor derives.
        trained_output = self.trained.process_images(images) if images else {}
        metadata = self.trained.image_metadata(trained_output, len(counts)) if images else []
        from ..adapters.processor import find_placeholders
        from ..data.chat import tokenize_rendered

        # the whole text in one pass, each placeholder's tokens replaced (as stock processors
        # tokenise the prompt with the placeholders expanded)
        found = find_placeholders(text[0], self.trained.image_placeholder)
        assert len(found) == len(counts), (
            f"{len(found)} image placeholders for {len(counts)} images"
        )

        def expand(k: int, _part: Any) -> list[int]:
            return [int(i) for i in self.trained.expand_image(counts[k], metadata[k])]

        ids, _, _ = tokenize_rendered(self.tokenizer, text[0], [], found, expand)
        import torch

        encoded = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
        encoded["attention_mask"] = encoded["attention_mask"].long()
        return {**vision, **encoded, **self.trained.extra_features(encoded)}
