"""Speculative decoding: proposals for a sequence's next tokens, verified by the target model in
one k-token step (`Sequence.spec_tokens`, `SchedulerOutput.num_logits`, `BlockManager.rollback`).

- `proposers.py` (here): where proposals come from inside the server, off by default (EngineConfig
  `speculative_model`): prompt lookup (n-grams of the sequence itself) or a small draft model. They
  see token ids only, never the engine's sequences.
- `engine/speculator.py`: which running sequences get proposals, and how many, before each step.
- `sampling/acceptance.py`: which proposals a step keeps, and the token after them (greedy: while
  the target agrees; sampled: TensorRT-LLM's rules), so the output follows the target model's
  distribution whatever the proposals.
- A client's own proposals (`draft_input_ids`) need neither proposer nor speculator: the engine
  verifies them in the first generation step (`Request.draft`).
"""
