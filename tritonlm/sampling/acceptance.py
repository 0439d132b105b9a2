"""Verifying proposals against the target model's rows of one step.

A sequence fed its pending token and K proposals gets K + 1 logits rows: row j predicts the token
after proposal j - 1 (row 0: after the pending token). The rows were processed (logits processors,
temperature) with the prefix each one sees, prompt + output + proposals[:j]. Walking the rows:

- without draft probabilities (the proposals are plain ids: prompt lookup, a draft model, or
  `draft_input_ids` alone), TensorRT-LLM's rule by ids: draw the target's token for row j as
  sampling would; keep going while it equals proposal j. Greedy, that is "while the draft is the
  argmax"; sampled, each emitted token is still exactly a draw from the target's distribution;
- with draft probabilities q (`draft_logits`), the speculative-sampling rule: accept proposal x with
  probability min(1, p(x) / q(x)) (`threshold` in place of the uniform draw when given); on
  rejection draw from normalize(max(0, p - q)). A greedy target has a one-hot p, which makes this
  the greedy rule again.

After K accepted proposals, row K gives one more token, so a step yields 1 to K + 1 tokens.
"""

from __future__ import annotations

import torch

from tritonlm.sampling.draws import ACCEPTANCE, uniform
from tritonlm.sampling.ops import choose, draw, probabilities
from tritonlm.sampling.params import SamplerInput


def verify(
    rows: torch.Tensor,
    inputs: list[SamplerInput],
    proposals: list[int],
    draft_probs: torch.Tensor | None = None,
    threshold: float | None = None,
) -> list[int]:
    """The tokens a step emits: the accepted proposals, then the target's own next token.

    `rows` [K + 1, vocab]: processed logits; `inputs[j]`: row j's sampler input; `draft_probs`
    [K, vocab]: the drafter's distribution at each proposal, if known."""
    assert rows.shape[0] == len(proposals) + 1 == len(inputs)
    out: list[int] = []
    for j, proposal in enumerate(proposals):
        s = inputs[j]
        if draft_probs is None:
            token = int(choose(rows[j : j + 1], [s])[0])
            if token != proposal:
                return [*out, token]
        else:
            p = probabilities(rows[j], s)
            q = draft_probs[j].to(p.device, p.dtype)
            if not _accepted(p[proposal], q[proposal], s, threshold):
                residual = (p - q).clamp(min=0)
                if float(residual.sum()) <= 0:  # p <= q everywhere, i.e. p == q: p itself
                    residual = p
                token = int(residual.argmax()) if s.params.greedy else draw(residual, s)
                return [*out, token]
        out.append(proposal)
    return [*out, int(choose(rows[-1:], [inputs[-1]])[0])]


def _accepted(p: torch.Tensor, q: torch.Tensor, s: SamplerInput, threshold: float | None) -> bool:
    """min(1, p/q) > u, with u uniform (the request's draw for the proposal's position) or the
    constant threshold; a token the target cannot produce (p = 0) is never accepted."""
    p, q = float(p), float(q)
    if p <= 0.0:
        return False
    if s.params.greedy:  # one-hot p: the proposal is the argmax
        return True
    if threshold is not None:
        return p >= threshold * q
    return uniform(s.random_key or 0, s.position, ACCEPTANCE) * q <= p
