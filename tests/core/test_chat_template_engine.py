"""A Gemma-3 file without tokenizer.chat_template (issue 45, defect 3; the test model is one: the Models
page says Template "no"): it was spoken to in ChatML and answered ``<|im_start|>assistant``; now
llama.cpp's built-in Gemma format is used (real engine)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lazykv.core.engine.chat_template import TemplateSource
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.kinds import KvMode

GREEDY = SamplingSettings(temperature=0.0, seed=1)
MARKERS = ("<|im_start|>", "<|im_end|>", "im_start", "im_end", "<start_of_turn>", "<end_of_turn>", "<eos>",
           "<|eot_id|>")


def _run(stream):  # noqa: ANN001, ANN202 - a reply generator
    pieces = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as end:
            return "".join(pieces), end.value


def test_gemma_without_a_template_replies_in_gemmas_format_without_markers(gemma3_path: Path) -> None:
    assert not read_model_meta(gemma3_path).has_chat_template  # the file has none
    s = EngineSession()
    try:
        info = s.load(LoadSpec(gemma3_path, n_ctx=512, kv_mode=KvMode.F16, kv_recent=0))
        hello = [{"role": "user", "content": "Hello! Who are you?"}]
        reply, result = _run(s.stream_reply(hello, GREEDY, threading.Event(), max_tokens=32))
        assert reply.strip(), result
        assert not [m for m in MARKERS if m in reply], reply  # in ChatML it said <|im_start|>assistant
        choice = info.chat_template
        assert choice is not None and choice.source is TemplateSource.BUILTIN
        assert (choice.name, choice.found_by) == ("gemma", "special tokens")
        prompt = s.chat_prompt(hello)
        tokens, stop = prompt.tokens, prompt.stop
        assert "<end_of_turn>" in stop
        text = s._llama.detokenize(tokens, special=True).decode()  # type: ignore[union-attr]
        assert text.startswith("<bos><start_of_turn>user\nHello") and text.endswith("<start_of_turn>model\n")
    finally:
        s.close()


def test_the_files_own_template_is_still_used(smollm2_path: Path) -> None:
    assert read_model_meta(smollm2_path).has_chat_template
    s = EngineSession()
    try:
        info = s.load(LoadSpec(smollm2_path, n_ctx=256, kv_mode=KvMode.F16, kv_recent=0))
        assert info.chat_template is not None and info.chat_template.source is TemplateSource.FILE
        prompt = s.chat_prompt([{"role": "user", "content": "Hi"}])
        tokens, stop = prompt.tokens, prompt.stop
        assert "<|im_end|>" in stop
        text = s._llama.detokenize(tokens, special=True).decode()  # type: ignore[union-attr]
        assert "You are a helpful AI assistant named SmolLM" in text  # only the file's template says so
    finally:
        s.close()


CRAFTED = {  # a crafted file's template, each of which overflowed the stack of llama.cpp's Jinja engine
    # read at load (common's parser): the load is refused
    "{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}":
        "The model's chat template cannot be used: nested deeper than 128 levels.",
    # run when a prompt is rendered: the prompt is refused
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}":
        "The model's chat template refused these messages: statements nested deeper than 256 levels",
}


@pytest.mark.parametrize("template", list(CRAFTED), ids=["nested parentheses", "self-calling macro"])
def test_a_crafted_template_in_a_model_file_is_refused_with_a_sentence(
        smollm2_path: Path, tmp_path: Path, template: str) -> None:
    """A GGUF whose template nests without end killed the app when it was opened or spoken to; now the
    load or the prompt is refused with a sentence, the details holding the rest. In a child process: an
    abort fails this test only."""
    crafted, source = tmp_path / "crafted.gguf", tmp_path / "template.jinja"
    source.write_text(template)
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2_path), str(crafted),
                    "--chat-template-file", str(source), "--force"],
                   check=True, capture_output=True, timeout=120)
    script = (
        "import sys\n"
        "from lazykv.core.errors import EngineError\n"
        "from lazykv.core.engine.engine import EngineSession\n"
        "from lazykv.core.engine.load_spec import LoadSpec\n"
        "from lazykv.core.kinds import KvMode\n"
        "s = EngineSession()\n"
        "try:\n"
        "    s.load(LoadSpec(sys.argv[1], n_ctx=256, kv_mode=KvMode.F16, kv_recent=0))\n"
        "    s.chat_prompt([{'role': 'user', 'content': 'Hi'}])\n"
        "    print('rendered')\n"
        "except EngineError as err:\n"
        "    print(str(err))\n"
        "    print('details' if err.details else 'no details')\n"
        "finally:\n"
        "    s.close()\n")
    done = subprocess.run([sys.executable, "-c", script, str(crafted)], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == [CRAFTED[template], "details"], done.stdout
