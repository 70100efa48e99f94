"""Per-sequence log-probabilities and the pair objectives (DPO, SimPO, ORPO).

Log-probabilities come from the logits at the label positions, the path SFT uses: with
``logits_at_labels_only`` the model returns ``(n, vocab)`` logits for the ``n`` label tokens
and ``loss_inputs["label_mask"]`` says where they were; without it, ``(batch, seq, vocab)``
logits whose ignored positions are dropped here. ``preference_sequence`` (see
:mod:`hyper_preference.batching`) maps each label to its sequence: sequence ``2i`` is pair
``i``'s chosen reply, ``2i + 1`` its rejected one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.batching.types import IGNORE_INDEX

from .batching import PAIRS_KEY, SEQUENCE_FIELD

if TYPE_CHECKING:
    import torch

    from .config import PreferenceConfig

#: ``loss_inputs`` key of the reference log-probs, ``(2 · pairs,)`` in sequence order.
REFERENCE_KEY = "reference_logps"


@attrs.frozen
class SequenceLogps:
    """Summed label log-probabilities of each sequence, and its label-token count."""

    logps: torch.Tensor  # (2P,) float32
    counts: torch.Tensor  # (2P,) float32
    #: (2P,) label tokens the argmax does not predict (exact match); None unless asked.
    misses: torch.Tensor | None = None

    @property
    def chosen(self) -> torch.Tensor:
        return self.logps[0::2]

    @property
    def rejected(self) -> torch.Tensor:
        return self.logps[1::2]

    def mean(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Length-normalised log-probs of the chosen and the rejected replies."""
        avg = self.logps / self.counts.clamp(min=1.0)
        return avg[0::2], avg[1::2]


def sequence_logps(
    logits: torch.Tensor, loss_inputs: dict[str, Any], *, misses: bool = False
) -> SequenceLogps:
    """Per-sequence sums of the label tokens' log-probabilities (float32)."""
    import torch

    labels = loss_inputs["labels"]
    sequence = loss_inputs[SEQUENCE_FIELD]
    mask = loss_inputs.get("label_mask")
    if mask is not None and labels.dim() == 1:  # logits at the label positions only
        sequence = sequence[mask]
        flat_logits = logits.reshape(-1, logits.shape[-1])
    else:
        keep = labels != IGNORE_INDEX
        sequence, labels = sequence[keep], labels[keep]
        flat_logits = logits[keep]
    n = 2 * int(loss_inputs[PAIRS_KEY])
    token_logps = -torch.nn.functional.cross_entropy(flat_logits.float(), labels, reduction="none")
    index = sequence - 1  # 0 is "no sequence", never a label position
    zeros = torch.zeros(n, dtype=torch.float32, device=token_logps.device)
    logps = zeros.index_add(0, index, token_logps)
    counts = zeros.index_add(0, index, torch.ones_like(token_logps))
    wrong = None
    if misses:
        hit = flat_logits.detach().argmax(-1) == labels
        wrong = zeros.index_add(0, index, (~hit).float())
    return SequenceLogps(logps=logps, counts=counts, misses=wrong)


@attrs.frozen
class PairTerms:
    """Each pair's loss and its implicit rewards (detached)."""

    losses: torch.Tensor  # (P,)
    chosen_rewards: torch.Tensor  # (P,)
    rejected_rewards: torch.Tensor  # (P,)


def _smoothed(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """``-log σ(x)``, with conservative label smoothing ``ε``: ``-(1-ε) log σ(x) - ε log σ(-x)``."""
    import torch.nn.functional as F

    loss = -F.logsigmoid(logits)
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-logits)
    return loss


def pair_terms(
    cfg: PreferenceConfig, policy: SequenceLogps, reference: torch.Tensor | None
) -> PairTerms:
    """The objective of ``cfg.loss`` per pair (``reference``: ``(2P,)`` log-probs, for DPO).

    * ``sigmoid`` (DPO): ``r = β (log π − log π_ref)``; loss ``-log σ(r_c − r_r)``.
    * ``simpo``: ``r = β · mean token log π``; loss ``-log σ(r_c − r_r − γ)``.
    * ``orpo``: the chosen reply's mean token NLL ``- β log σ(log odds_c − log odds_r)``,
      ``odds = p / (1 − p)`` of the mean token probability; rewards ``β · mean log π``.

    ``sft_weight`` adds that times the chosen reply's mean token NLL to any of them.
    """
    import torch
    import torch.nn.functional as F

    beta = cfg.beta
    chosen_avg, rejected_avg = policy.mean()
    if cfg.loss == "sigmoid":
        if reference is None:
            raise ValueError("DPO needs reference log-probs")
        chosen_rewards = beta * (policy.chosen - reference[0::2])
        rejected_rewards = beta * (policy.rejected - reference[1::2])
        losses = _smoothed(chosen_rewards - rejected_rewards, cfg.label_smoothing)
    elif cfg.loss == "simpo":
        chosen_rewards, rejected_rewards = beta * chosen_avg, beta * rejected_avg
        losses = _smoothed(chosen_rewards - rejected_rewards - cfg.simpo_gamma, cfg.label_smoothing)
    elif cfg.loss == "orpo":
        log_odds = (chosen_avg - rejected_avg) - (
            torch.log1p(-torch.exp(chosen_avg)) - torch.log1p(-torch.exp(rejected_avg))
        )
        losses = -chosen_avg - beta * F.logsigmoid(log_odds)
        chosen_rewards, rejected_rewards = beta * chosen_avg, beta * rejected_avg
    else:
        raise ValueError(f"unknown preference loss {cfg.loss!r}")
    if cfg.sft_weight:
        losses = losses - cfg.sft_weight * chosen_avg
    return PairTerms(
        losses=losses,
        chosen_rewards=chosen_rewards.detach(),
        rejected_rewards=rejected_rewards.detach(),
    )


def reward_sums(terms: PairTerms, policy: SequenceLogps) -> torch.Tensor:
    """``[pairs, Σ loss, Σ r_c, Σ r_r, Σ (r_c > r_r), Σ chosen exact]`` (float64, detached):
    the running sums behind the reward metrics."""
    import torch

    exact = (
        (policy.misses[0::2] == 0).double().sum()
        if policy.misses is not None
        else torch.zeros((), dtype=torch.float64, device=terms.losses.device)
    )
    return torch.stack(
        [
            torch.tensor(float(terms.losses.numel()), dtype=torch.float64, device=exact.device),
            terms.losses.detach().double().sum(),
            terms.chosen_rewards.double().sum(),
            terms.rejected_rewards.double().sum(),
            (terms.chosen_rewards > terms.rejected_rewards).double().sum(),
            exact,
        ]
    )
