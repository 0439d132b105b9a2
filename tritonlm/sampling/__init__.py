"""Choosing tokens: sampling parameters, the logits-processor pipeline, the sampler, beam search."""
