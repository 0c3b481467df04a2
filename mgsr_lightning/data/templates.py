"""Prompt templates: the Alpaca-style template of MiniLLM/DistiLLM, the tokenizer's chat template, or
the bare instruction.

An example is a mapping with ``instruction`` (required), ``input`` (optional context) and ``output``
(the reference response). ``render_prompt`` returns the text the model is conditioned on; the
response is appended after it, followed by EOS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

PromptTemplate = Literal["alpaca", "chat", "plain"]

ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)


def render_prompt(example: Mapping[str, str], template: PromptTemplate = "alpaca", tokenizer=None) -> str:
    """The prompt text for one example.

    - ``alpaca``: MiniLLM/DistiLLM's template (with the ``### Input:`` block only when ``input`` is
      non-empty), so scores are comparable with the published tables.
    - ``chat``: ``tokenizer.apply_chat_template`` with one user turn (instruction, then the input on
      a new paragraph) and the generation prompt, for instruct models with a chat format.
    - ``plain``: the instruction (and input) followed by a newline.
    """
    instruction = example["instruction"]
    context = (example.get("input") or "").strip()
    if template == "alpaca":
        if context:
            return ALPACA_WITH_INPUT.format(instruction=instruction, input=context)
        return ALPACA_NO_INPUT.format(instruction=instruction)
    user_text = f"{instruction}\n\n{context}" if context else instruction
    if template == "plain":
        return user_text + "\n"
    if template == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "template='chat' needs a tokenizer with a chat template; this tokenizer has none "
                "(use template='alpaca' or 'plain')."
            )
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
        )
    raise ValueError(f"unknown prompt template {template!r}; expected one of 'alpaca', 'chat', 'plain'")
