"""The decode loop and the scoring forwards.

- :mod:`.scoring`: ``response_logits`` and its cached variants, logits aligned with a rollout's response.
- :mod:`.decode`: ``sample``, our decode loop, and the ``Decoding`` it takes.
- :mod:`.sampling`: the sampling and decode-loop settings, and the token choice.
- :mod:`.kv_cache`: a realigned prefix cache, the preallocated (static) cache and the compiled one-token step.
"""
