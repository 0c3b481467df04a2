"""Span priors, MGSR's span level: which response tokens form one phrase-like span.

- :mod:`.token_prior`: ``TokenSpanPrior`` (from token ids, the default) and ``build_span_prior``.
- :mod:`.text_prior`: ``TextChunkSpanPrior`` (a linguistic chunker on decoded text, optional).
- :mod:`.vocabulary`: the text each vocabulary entry stands for, which both priors read.
"""
