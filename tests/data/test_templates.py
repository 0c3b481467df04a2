import pytest

from mgsr_lightning.data.templates import render_prompt


def test_alpaca_template_matches_minillm_without_and_with_input():
    no_input = render_prompt({"instruction": "Name a colour.", "input": ""})
    assert no_input == (
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nName a colour.\n\n### Response:\n"
    )
    with_input = render_prompt({"instruction": "Reverse it.", "input": "abc"})
    assert with_input == (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nReverse it.\n\n"
        "### Input:\nabc\n\n### Response:\n"
    )


def test_plain_template():
    assert render_prompt({"instruction": "Do it.", "input": "x"}, "plain") == "Do it.\n\nx\n"


def test_chat_template_uses_the_tokenizer(tiny_tokenizer):
    tokenizer = tiny_tokenizer
    tokenizer.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    try:
        assert render_prompt({"instruction": "Hi", "input": ""}, "chat", tokenizer) == "<user>Hi<assistant>"
    finally:
        tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        render_prompt({"instruction": "Hi"}, "chat", tokenizer)


def test_unknown_template():
    with pytest.raises(ValueError, match="unknown prompt template"):
        render_prompt({"instruction": "Hi"}, "vicuna")
