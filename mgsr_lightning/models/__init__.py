"""Models and tokenizers: loading, LoRA, locally trained tokenizers, checks made without weights, export.

- :mod:`.loading`: ``ModelSource``, ``load_causal_lm`` and the pair's vocabulary check.
- :mod:`.lora`: LoRA adapters through ``peft``.
- :mod:`.tokenizer`: byte-level BPE tokenizers trained locally, and token-id helpers.
- :mod:`.gpt2_bpe`: GPT-2's own tokenizer, built offline from the ``gpt2.tiktoken`` file openai-whisper ships.
- :mod:`.output_head`: a model's output head as a matrix, for the fused head (or why it is more than that).
- :mod:`.checks`: what a model's config and saved tokenizer say, read without its weights.
- :mod:`.export`: a trained student saved in Hugging Face format.
"""
