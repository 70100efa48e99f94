"""The conformance check that training's ids are the ids of the rendered conversation: the
adapter's transform gives exactly ``apply_chat_template(..., tokenize=True)`` of the chat
template an export saves, on the kit's samples and on text that tokenises across piece
boundaries (leading, trailing and double spaces, newline-only content, non-ASCII text).

It is :data:`hyper_core.testing.conformance.CHECKS` ``["one_pass_tokens"]``; the message of a
difference (:func:`describe_difference`) shows the ids and token strings around it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..adapters.processor import ImageTextProcessor
    from ..data.conversation import Conversation
    from .conformance_fixture import AdapterUnderTest

#: Tokens shown on each side of the first difference.
CONTEXT = 4


def _edge_sample(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


#: Text-only samples whose text merges across piece boundaries in many tokenizers.
EDGE_SAMPLES: tuple[dict[str, Any], ...] = (
    _edge_sample(("user", " leading space"), ("assistant", " a square")),
    _edge_sample(("user", "trailing space "), ("assistant", "a circle  ")),
    _edge_sample(
        ("system", "Be  brief."), ("user", "double  spaces"), ("assistant", "red  and  blue")
    ),
    _edge_sample(("user", "\n"), ("assistant", "\n"), ("user", "again"), ("assistant", "\n\n")),
    _edge_sample(("user", "Wie heißt das? 形は"), ("assistant", "Ein Kreis — 円です")),
)


def describe_difference(
    got: Sequence[int], expected: Sequence[int], tokenizer: Any, names: tuple[str, str]
) -> str:
    """Where ``got`` first differs from ``expected``: ids and token strings (``repr``, so
    spaces show) of :data:`CONTEXT` tokens either side, for each; empty when equal."""
    if list(got) == list(expected):
        return ""
    at = next(
        (i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected))
    )

    def around(ids: Sequence[int]) -> str:
        window = [int(i) for i in ids[max(0, at - CONTEXT) : at + CONTEXT + 1]]
        tokens = tokenizer.convert_ids_to_tokens(window)
        return f"ids {window} tokens {tokens!r}"

    return (
        f"at token {at} ({names[0]} {len(got)} tokens, {names[1]} {len(expected)}): "
        f"{names[0]} {around(got)} vs {names[1]} {around(expected)} "
        f"(from token {max(0, at - CONTEXT)})"
    )


def _collapse(ids: Sequence[int], image_ids: Collection[int]) -> list[int]:
    """``ids`` with each run of an image (or video) token id reduced to one, as a
    placeholder holds it before the processor expands it."""
    out: list[int] = []
    for i in ids:
        if i in image_ids and out and out[-1] == i:
            continue
        out.append(int(i))
    return out


def template_ids(tokenizer: Any, messages: list[dict[str, Any]], *, generation: bool) -> list[int]:
    """``apply_chat_template(messages, tokenize=True)``'s ids, as a plain list."""
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation, return_dict=False
    )
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return [int(i) for i in out]


def image_expansions(processor: ImageTextProcessor, conversation: Conversation) -> list[list[int]]:
    """Each image's ids as training expands them: ``processor.expand_image`` of its feature
    count and its per-image metadata (a crop count, a tile grid), from ``process_images`` of
    the conversation's images."""
    from ..data.conversation import load_images

    images = load_images(conversation)
    if not images:
        return []
    output = dict(processor.process_images(images))
    counts = processor.image_token_counts(output)
    metadata = processor.image_metadata(output, len(counts))
    return [[int(i) for i in processor.expand_image(n, m)] for n, m in zip(counts, metadata)]


def expand_placeholders(
    stock: Sequence[int], expansions: Sequence[Sequence[int]], processor: Any
) -> list[int] | None:
    """``stock`` with the ``k``-th image placeholder's ids replaced by ``expansions[k]``
    (:func:`image_expansions`): what a stock processor tokenises when its expansion adds
    tokens around the image tokens (Gemma 3's ``\n\n``/``<end_of_image>``, its pan-and-scan
    text). None without a placeholder."""
    image_id = getattr(processor, "image_token_id", None)
    placeholder = getattr(processor, "image_placeholder", None)
    if image_id is None or not placeholder:
        return None
    p_ids = [int(i) for i in processor.tokenizer.encode(placeholder, add_special_tokens=False)]
    out: list[int] = []
    i = k = 0
    while i < len(stock):
        if k < len(expansions) and list(stock[i : i + len(p_ids)]) == p_ids:
            out += [int(x) for x in expansions[k]]
            i += len(p_ids)
            k += 1
        else:
            out.append(int(stock[i]))
            i += 1
    return out


def assert_one_pass(
    what: str,
    training: Sequence[int],
    stock: Sequence[int],
    tokenizer: Any,
    image_ids: Collection[int] = (),
    processor: Any = None,
    expansions: Sequence[Sequence[int]] = (),
) -> None:
    """``AssertionError`` unless training's ids (images collapsed) equal the template's, or,
    with ``processor``, equal the template's with each placeholder replaced by its image's
    ``expansions`` (:func:`expand_placeholders`)."""
    if processor is not None and list(training) == expand_placeholders(
        stock, expansions, processor
    ):
        return
    diff = describe_difference(
        _collapse(training, image_ids),
        _collapse(stock, image_ids),
        tokenizer,
        ("training", "template"),
    )
    assert not diff, f"{what}: training ids differ from the rendered string's {diff}"


def check_one_pass_tokens(t: AdapterUnderTest) -> str:
    """Training's ids (the transform's, and the generation prompt's) equal
    ``apply_chat_template(..., tokenize=True)`` of the saved chat template on each sample and
    on :data:`EDGE_SAMPLES`, each image's expansion compared as its placeholder (or the
    placeholder expanded as the processor does for that image, :func:`expand_placeholders`)."""
    from ..data.conversation import parse_conversation

    tokenizer = t.assets.tokenizer
    assert getattr(tokenizer, "chat_template", None), "the tokenizer has no chat template to save"
    processor = t.assets.processor
    image_ids = {
        int(i)
        for i in (
            getattr(processor, "image_token_id", None),
            getattr(processor, "video_token_id", None),
        )
        if i is not None
    }
    samples = [*t.samples, *EDGE_SAMPLES]
    for i, sample in enumerate(samples):
        conversation = parse_conversation(sample)
        trained = t.adapter.transform(sample, t.assets, max_seq_len=t.max_seq_len)
        stock = template_ids(tokenizer, conversation.to_messages(), generation=False)
        images = [] if processor is None else image_expansions(processor, conversation)
        found = trained.input_ids.tolist()
        assert_one_pass(f"sample {i}", found, stock, tokenizer, image_ids, processor, images)
        prompt, _ = conversation.prompt_and_answer()
        ids = t.adapter.generation_prompt(prompt, t.assets).features.input_ids.tolist()
        stock = template_ids(tokenizer, prompt.to_messages(), generation=True)
        what = f"sample {i}'s prompt"
        assert_one_pass(what, ids, stock, tokenizer, image_ids, processor, images)
    return f"{len(samples)} conversations and their prompts"
