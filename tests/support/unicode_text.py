"""Text of every kind for the property tests of what shows text (the Markdown renderer, the transcript)."""

from __future__ import annotations

from hypothesis import strategies as st

# what a marker looked like inside the text before the fix: U+E000, digits, U+E001
LOOKALIKES = ["\ue0000\ue001", "\ue0007\ue001", "a\ue000123\ue001b", "\ue000\ue001",
              "```\n\ue0003\ue001\n```", "`\ue0001\ue001`", "[x\ue0000\ue001](http://e.com/)"]
# every plane, private use, RTL, combining marks, NUL, lone surrogates (an import can hold them), and
# what made up a marker before the fix
ANY_CHARACTER = st.one_of(
    st.characters(exclude_categories=()), st.characters(categories=["Cs"]), st.characters(categories=["Co"]),
    st.characters(categories=["Mn", "Me"]), st.characters(categories=["Cc", "Cf", "Zl", "Zp"]),
    st.sampled_from(["\0", "\u202e", "\u200f", "\u05d0", "\u0627", "\ue000", "\ue001", "0", "1", "\n",
                     "`", "*"]),
)
ANY_TEXT = st.lists(st.one_of(ANY_CHARACTER, st.sampled_from(LOOKALIKES)), max_size=60).map("".join)


def visible(text: str) -> list[str]:
    """The characters of ``text`` that are not white space, as Qt shows them: text is UTF-16 there,
    so a surrogate pair is the one character it encodes; NUL and a lone surrogate show as U+FFFD."""
    utf16 = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return [c if c != "\0" else "\ufffd" for c in "".join(utf16.split())]
