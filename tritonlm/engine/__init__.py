"""The engine core: the step loop, the scheduler, the KV block manager, requests and sequences."""
