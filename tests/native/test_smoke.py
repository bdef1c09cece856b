"""The patched engine generates sensible text with f16 and q8_0 caches."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from .helpers import greedy, make_llama


def test_patched_engine_installed() -> None:
    assert llama_cpp.__version__.startswith("0.3.36+lazykv.")


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_smollm2_answers_a_simple_question(smollm2_path: Path, kv: str) -> None:
    llm = make_llama(smollm2_path, kv)
    text = llm.detokenize(greedy(llm, llm.tokenize(b"The capital of France is"), 12)).decode()
    assert "Paris" in text


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_smollm2_chat_reply(smollm2_path: Path, kv: str) -> None:
    """The answer names what only the model knows: an echo of the question, or any text that is not
    the model's, fails (issue 24: "planet" was in the question)."""
    llm = make_llama(smollm2_path, kv)
    question = "What color is the sky on a clear day?"
    completion = llm.create_chat_completion(
        [{"role": "user", "content": question}], temperature=0.0, max_tokens=24,
    )
    reply = completion["choices"][0]["message"]["content"]
    assert "blue" in reply.lower() and "blue" not in question
    assert completion["usage"]["completion_tokens"] > 0 and reply.strip() != question
