"""The chat format of a model file without a template (issue 45, defect 3): llama.cpp's built-in one for
its family, chosen by llama.cpp's own detection, else a plain transcript; no model needed."""

from __future__ import annotations

import pytest

from lazykv.core.engine import chat_template
from lazykv.core.engine.chat_template import ChatTemplateChoice, TemplateSource, choose

# special tokens as the families' vocabularies hold them (control and user-defined tokens)
GEMMA3 = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", "<unused0>", "<unused1>",
          "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
SMOLLM2 = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
           "<filename>", "<gh_stars>", "<issue_start>", "<jupyter_start>", "<empty_output>"]
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|start_header_id|>",
          "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
PHI3 = ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|system|>", "<|end|>",
        "<|user|>"]
MISTRAL_BASE = ["<unk>", "<s>", "</s>"]
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(("architecture", "specials", "name", "end"), [
    ("gemma3", GEMMA3, "gemma", "<end_of_turn>"),
    ("llama", SMOLLM2, "chatml", "<|im_end|>"),
    ("qwen2", SMOLLM2, "chatml", "<|im_end|>"),
    ("llama", LLAMA3, "llama3", "<|eot_id|>"),
    ("phi3", PHI3, "phi3", "<|end|>"),
])
def test_a_file_without_a_template_gets_its_familys_builtin_format(
    architecture: str, specials: list[str], name: str, end: str
) -> None:
    choice = choose(None, architecture, specials)
    assert choice.source is TemplateSource.BUILTIN and choice.name == name
    assert choice.found_by == "special tokens" and end in choice.end_markers
    assert f"built-in “{name}” format: the file has none" in choice.words
    assert name in choice.short and not choice.from_file


def test_the_files_own_template_wins_over_any_builtin() -> None:
    choice = choose("{{ messages[0]['content'] }}", "gemma3", GEMMA3)
    assert choice == ChatTemplateChoice(TemplateSource.FILE) and choice.from_file
    assert choice.words == "From the model file"


def test_an_architecture_named_as_a_builtin_template_is_the_fallback() -> None:
    assert "deepseek2" in chat_template.builtin_names()
    choice = choose("", "deepseek2", ["<unk>"])
    assert choice.source is TemplateSource.BUILTIN
    assert (choice.name, choice.found_by) == ("deepseek2", "architecture")


@pytest.mark.parametrize("architecture", ["llama", "gpt2", "gemma3"])
def test_none_known_is_a_plain_transcript_that_says_it_may_be_a_base_model(architecture: str) -> None:
    choice = choose(None, architecture, MISTRAL_BASE)
    assert choice.source is TemplateSource.PLAIN
    assert "none known" in choice.words and "base model" in choice.words
    assert "base model" in choice.short
    assert choice.end_markers == (chat_template.PLAIN_STOP,)
    prompt = chat_template.plain_prompt(HELLO, add_generation_prompt=True)
    assert prompt == "Be brief.\n\nUser: Hello\n\nAssistant:"
    assert chat_template.plain_prompt(HELLO, add_generation_prompt=False) == "Be brief.\n\nUser: Hello\n\n"


def test_gemmas_builtin_format_is_llama_cpps_and_ends_a_turn_with_end_of_turn() -> None:
    prompt = chat_template.render("gemma", HELLO, add_generation_prompt=True)
    assert prompt == "<start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n<start_of_turn>model\n"
    assert chat_template.builtin_end_markers("gemma") == ("<end_of_turn>",)
    assert chat_template.render("no-such-template", HELLO, add_generation_prompt=True) is None


def test_a_long_conversation_renders_whole() -> None:
    long = [{"role": "user", "content": "word " * 5000}, {"role": "assistant", "content": "ok " * 3000}]
    prompt = chat_template.render("chatml", long, add_generation_prompt=True)
    assert prompt is not None and prompt.count("word") == 5000 and prompt.endswith("<|im_start|>assistant\n")
