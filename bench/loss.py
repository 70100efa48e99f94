"""Loss: peak memory and time of the LM head + cross-entropy (forward and backward) for one
micro-batch with 38% label tokens: logits at every position (before), at label positions
only, and label positions in chunks (recomputed in backward).

Qwen-like head: hidden 896, vocabulary 151,936, fp32; 2,048 tokens (ci: 512). Each variant
runs in its own process; the figure is the rise of its peak RSS over the step (``VmHWM``,
reset first) after a warm-up step, whose gradients stay allocated: so it counts the buffers
the loss makes (logits, their fp32 copy, the log-softmax kept for backward, the logits'
gradient); the one transient copy of the weight's gradient that every variant makes
(vocab × hidden fp32) is subtracted.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .runner import Result

VARIANTS = ("every_position", "label_positions", "chunked")

_CHILD = r"""
import json, re, sys, time
from pathlib import Path
import torch
from hyper_core.step.chunked_loss import chunked_causal_lm_loss
from hyper_core.step.loss import causal_lm_loss

variant, tokens, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hidden_size, vocab = 896, 151_936
torch.manual_seed(0)
head = torch.nn.Linear(hidden_size, vocab, bias=False)
hidden = torch.randn(1, tokens, hidden_size, requires_grad=True)
labels = torch.randint(0, vocab, (1, tokens))
labels[torch.rand(1, tokens) >= 0.38] = -100
n = float((labels != -100).sum())

class Out:
    def __init__(self, logits): self.logits = logits

def rss(field):
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024

def step():
    if variant == "every_position":
        loss, _ = causal_lm_loss(Out(head(hidden)), {"labels": labels}, n)
    else:
        mask = labels != -100
        rows = hidden[mask]
        if variant == "label_positions":
            loss, _ = causal_lm_loss(Out(head(rows)), {"labels": labels[mask]}, n)
        else:
            loss = chunked_causal_lm_loss(rows, head, labels[mask], n, chunk)
    loss.backward()
    return loss.item()

step()  # warm-up: allocator, kernels; the gradients stay allocated (accumulated into)
Path("/proc/self/clear_refs").write_text("5")
before = rss("VmRSS")
t0 = time.perf_counter()
loss = step()
seconds = time.perf_counter() - t0
# The weight's gradient is computed whole and then accumulated: one (vocab x hidden) fp32
# transient in every variant, not a logits buffer.
weight_grad = head.weight.numel() * 4
print(json.dumps({"peak": rss("VmHWM") - before - weight_grad, "seconds": seconds, "loss": loss}))
"""


def _measure(variant: str, tokens: int, chunk: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, variant, str(tokens), str(chunk)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(size: str = "full") -> Result:
    """Each variant ``repeats`` times, interleaved."""
    tokens = 512 if size == "ci" else 2048
    chunk = 256
    repeats = 1 if size == "ci" else 3
    result = Result("loss", "LM head + cross-entropy of one micro-batch, 38% label tokens")
    result.params = {"tokens": tokens, "vocab": 151_936, "hidden": 896, "chunk_tokens": chunk}
    losses = {}
    for _ in range(repeats):
        for variant in VARIANTS:
            rec = _measure(variant, tokens, chunk)
            result.figure(f"{variant}_logits_memory", "bytes").values.append(rec["peak"])
            result.figure(f"{variant}_seconds", "s").values.append(rec["seconds"])
            losses[variant] = rec["loss"]
    result.notes.append(f"losses: {losses}")
    from .runner import Ratio

    result.ratios["label_positions_memory"] = Ratio(
        "label_positions_logits_memory", "every_position_logits_memory", "<= 0.45"
    )
    result.ratios["chunked_memory"] = Ratio(
        "chunked_logits_memory", "every_position_logits_memory", "<= 0.45"
    )
    result.ratios["label_positions_time"] = Ratio(
        "label_positions_seconds", "every_position_seconds"
    )
    return result
