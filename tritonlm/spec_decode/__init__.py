"""Speculative decoding: proposals for a sequence's next tokens, verified by the target model in
one k-token step (`Sequence.spec_tokens`, `SchedulerOutput.num_logits`, `BlockManager.rollback`).

- `acceptance.py`: which proposals a step keeps, and the token after them (greedy: while the target
  agrees; sampled: TensorRT-LLM's rules), so the output follows the target model's distribution
  whatever the proposals.
- `proposers.py`: where proposals come from inside the server, off by default (EngineConfig
  `speculative_mode`): prompt lookup (n-grams of the sequence itself) or a small draft model.
- A client's own proposals (`draft_input_ids`) need neither: the engine verifies them in the first
  generation step (`Request.draft`).
"""
