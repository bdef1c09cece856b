"""The Markdown renderer on its own: any text renders as the text it is, markers are carried apart from
the text (a text cannot forge one), and nothing a text holds makes it raise (issue 24, point 1)."""

from __future__ import annotations

import html
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtGui import QTextDocument

from lazykv.qt.markdown import LIGHT, MarkdownRenderer
from tests.support.unicode_text import ANY_TEXT, LOOKALIKES, visible

ASCII_PUNCTUATION = "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
# text without Markdown syntax: words of any characters but ASCII punctuation, on one or more lines
WORD = st.text(st.characters(exclude_categories=("Z", "Cc"), exclude_characters=ASCII_PUNCTUATION),
               min_size=1, max_size=12)
WORDS = st.lists(st.tuples(WORD, st.sampled_from([" ", "\n"])), max_size=12).map(
    lambda words: "".join(word + gap for word, gap in words))
BOUNDED = settings(max_examples=120, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def renderer() -> MarkdownRenderer:
    return MarkdownRenderer(LIGHT)


def shown(rich_text: str) -> str:
    """What Qt shows of ``rich_text``."""
    document = QTextDocument()
    document.setHtml(rich_text)
    return document.toPlainText()


@pytest.mark.parametrize("text", LOOKALIKES)
def test_text_that_looks_like_a_marker_renders_as_itself(qapp: object, renderer: MarkdownRenderer,
                                                          text: str) -> None:
    for rich_text in (renderer.render(text).html, renderer.plain(text)):
        assert "⟨" not in shown(rich_text)  # no marker was made up from the text
    assert shown(renderer.plain(text)) == text
    for piece in re.findall("\ue000[0-9]*\ue001", text):  # in code, prose or a link's text alike
        assert piece in shown(renderer.render(text).html)


def test_markers_are_shown_where_they_are_beside_text_that_looks_like_them(
    qapp: object, renderer: MarkdownRenderer
) -> None:
    text = "a\ue0000\ue001 b \ue0001\ue001 c"
    markers = [(1, "first"), (len(text), "last")]
    for rich_text in (renderer.render(text, 0, markers).html, renderer.plain(text, markers)):
        assert " ".join(shown(rich_text).split()) == "a ⟨first⟩ \ue0000\ue001 b \ue0001\ue001 c ⟨last⟩"


def test_a_marker_inside_a_code_block_or_a_link_address_is_kept(
    qapp: object, renderer: MarkdownRenderer
) -> None:
    text = "```python\nx = 1\ny = 2\n```\n\nsee [the docs](https://example.com/page) now"
    markers = [(text.index("y ="), "in code"), (text.index("example"), "in an address")]
    rendered = renderer.render(text, 0, markers)
    assert rendered.code_blocks == ["x = 1\ny = 2"]
    plain = shown(rendered.html)
    assert "⟨in code⟩" in plain and "⟨in an address⟩" in plain
    assert 'href="https://example.com/page"' in rendered.html


@BOUNDED
@given(text=ANY_TEXT,
       offsets=st.lists(st.integers(0, 220), max_size=4))
def test_any_text_renders_without_raising_and_typed_text_is_kept(
    qapp: object, renderer: MarkdownRenderer, text: str, offsets: list[int]
) -> None:
    markers = [(offset, f"m{k}") for k, offset in enumerate(offsets)]
    rendered = renderer.render(text, 0, markers)
    assert sum(shown(rendered.html).count(f"⟨m{k}⟩") for k in range(len(markers))) == len(markers)
    plain = renderer.plain(text)
    assert html.unescape(re.sub("<[^>]*>", "", plain)) == text  # a user's message, as typed


@BOUNDED
@given(text=WORDS)
def test_text_without_markdown_syntax_keeps_every_character(
    qapp: object, renderer: MarkdownRenderer, text: str
) -> None:
    assert visible(shown(renderer.render(text).html)) == visible(text)
