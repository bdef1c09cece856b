"""Markdown (CommonMark + tables + strikethrough) to the HTML subset Qt's rich text shows.

markdown-it-py parses, Pygments highlights fenced code (inline styles: Qt has no style sheets for
classes). Raw HTML in the source is never passed through (``html=False``): a model, an import or a
title that writes ``<b>`` or ``<img>`` shows those characters. Each code block gets a "Copy" link
``lazykv-copy:<message>/<block>``; the code itself is returned next to the HTML. A code line wider
than the message wraps, its continuation indented: the transcript never scrolls sideways. Markers
(e.g. "8-bit KV from here") are given apart from the text, as offsets: nothing a text holds is read
as a marker.
"""

from __future__ import annotations

import html
import re
import threading
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

COPY_SCHEME = "lazykv-copy"
# imported ahead on a background thread: loading a lexer's module the first time can take ~80 ms,
# too long for a GUI-thread render in the middle of a streaming reply
COMMON_LANGUAGES = ("python", "bash", "console", "javascript", "typescript", "json", "c", "cpp", "java",
                    "rust", "go", "sql", "yaml", "toml", "html", "css", "diff", "markdown")
_preloaded = threading.Event()
# the code points a marker's place can be held by while the parser runs: private-use ones, and of
# those only the ones the text being rendered does not contain (see _free_slots)
_SLOT_RANGES = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))
_TAG = re.compile(r"<[^>]*>")  # a tag of the rendered HTML (the text's own "<" is escaped)
# a code block is never wider than the message: a line longer than the view wraps (spaces kept,
# anywhere in a long word), its continuation indented under the line's own indentation plus this many
# columns, so that it is not taken for a line of its own. The text is unchanged: a copy or a
# selection gives the line whole.
CODE_WRAP_INDENT_COLUMNS = 4
TAB_COLUMNS = 4  # a tab in code: the transcript's tab stops are this many columns apart


@dataclass(frozen=True)
class Palette:
    """The colours a rendered message uses (light or dark)."""

    text: str
    muted: str
    link: str
    code_background: str
    code_border: str
    marker: str
    marker_background: str
    pygments_style: str
    mono_family: str = "monospace"
    mono_column_px: float = 8.0  # the width of one column of code (the transcript measures its font's)


LIGHT = Palette("#1f2328", "#6b7280", "#0969da", "#f6f8fa", "#d0d7de", "#9a6700", "#fff8c5", "default")
DARK = Palette("#e6edf3", "#9ca3af", "#58a6ff", "#161b22", "#30363d", "#e3b341", "#3b2f0b", "monokai")


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)


class MarkdownRenderer:
    """``render(text, message_index, markers)`` gives Qt rich text; one instance per palette."""

    def __init__(self, palette: Palette) -> None:
        self.palette = palette
        self._formatter = HtmlFormatter(noclasses=True, nowrap=True, style=palette.pygments_style)
        md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
        md.renderer.rules["fence"] = self._fence
        md.renderer.rules["code_block"] = self._fence
        md.renderer.rules["code_inline"] = self._code_inline
        md.renderer.rules["table_open"] = self._table_open
        md.renderer.rules["th_open"] = self._cell_open
        md.renderer.rules["td_open"] = self._cell_open
        md.renderer.rules["image"] = self._image
        normalize_link = md.normalizeLink
        md.normalizeLink = lambda url: normalize_link(self._without_slots(url))  # type: ignore[method-assign]
        self._md = md
        self._slots: dict[str, str] = {}  # placeholder -> marker label, while render() runs

    def render(
        self, text: str, message_index: int = 0, markers: list[tuple[int, str]] | None = None,
        first_block: int = 0,
    ) -> Rendered:
        """``markers``: (character offset, label) shown where they are in ``text``; code blocks are
        numbered from ``first_block`` in the Copy links (a part of a message rendered on its own).

        The text is never searched for markers: while markdown-it parses, each marker's place is
        held by a code point that ``text`` does not contain, so whatever the text holds (private-use
        characters, digits, anything) shows as itself and cannot pass for a marker. A marker whose
        place ends up where none can be shown (inside a link's address) follows the message."""
        markers = sorted(markers or [])
        slots = _free_slots(text, len(markers))
        placed = dict(zip(slots, (label for _, label in markers), strict=False))
        source = _with_placeholders(text, [offset for offset, _ in markers[:len(slots)]], slots)
        env: dict = {"message": message_index, "codes": [], "slots": placed, "first_block": first_block}
        self._slots = placed
        try:
            body = self._md.render(source, env)
        finally:
            self._slots = {}
        shown: set[str] = set()
        body = "".join(self._fill_slots(part, placed, shown) for part in _split_tags(body))
        left = [label for slot, label in placed.items() if slot not in shown]
        left += [label for _, label in markers[len(slots):]]
        return Rendered(body + "".join(self._marker(label) for label in left), env["codes"])

    def _without_slots(self, url: str) -> str:
        """A link's address as written: a marker's place inside it is left out (the marker follows)."""
        return "".join(c for c in url if c not in self._slots) if self._slots else url

    def _fill_slots(self, part: str, placed: dict[str, str], shown: set[str]) -> str:
        """A piece of the rendered HTML with its placeholders made markers (a tag: taken out)."""
        if not placed or not any(slot in part for slot in placed):
            return part
        if part.startswith("<"):
            return "".join(c for c in part if c not in placed)
        out = []
        for c in part:
            if c in placed:
                shown.add(c)
                out.append(self._marker(placed[c]))
            else:
                out.append(c)
        return "".join(out)

    def complete_prefix(self, text: str) -> int:
        """How many characters at the start of ``text`` form top-level blocks that nothing appended
        to ``text`` can change any more: every block but the last (a streaming reply renders them
        once; only the last block is re-rendered as it grows)."""
        starts = [t.map[0] for t in self._md.parse(text) if t.level == 0 and t.nesting >= 0 and t.map]
        if len(starts) < 2:
            return 0
        lines = text.splitlines(keepends=True)
        return sum(len(line) for line in lines[:starts[-1]])

    def plain(self, text: str, markers: list[tuple[int, str]] | None = None) -> str:
        """Text shown as typed (a user's message, a very long paste), line breaks kept."""
        out, done = [], 0
        for offset, label in sorted(markers or []):
            offset = max(done, min(offset, len(text)))
            out += [html.escape(text[done:offset]), self._marker(label)]
            done = offset
        out.append(html.escape(text[done:]))
        return f'<p style="white-space: pre-wrap">{"".join(out)}</p>'

    def _marker(self, label: str) -> str:
        p = self.palette
        return (f'<span style="color:{p.marker}; background-color:{p.marker_background}; font-style:italic">'
                f" ⟨{html.escape(label)}⟩ </span>")

    def _fence(self, tokens, idx, options, env) -> str:  # noqa: ANN001 - markdown-it's rule API
        token = tokens[idx]
        slots = env["slots"]
        found = [c for c in token.content if c in slots]
        code = "".join(c for c in token.content if c not in slots).rstrip("\n") if found else \
            token.content.rstrip("\n")
        language = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
        block = env["first_block"] + len(env["codes"])
        env["codes"].append(code)
        p = self.palette
        try:
            lexer = get_lexer_by_name(language) if language else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        lexer.stripnl = False
        highlighted = highlight(code, lexer, self._formatter).rstrip("\n")
        lines = highlighted.split("\n")  # Pygments closes its spans at each line's end
        sources = code.split("\n")
        if len(lines) != len(sources):  # a lexer that changed the lines: one block, no indentation read
            lines, sources = [highlighted], [""]
        label = html.escape(language) if language else "code"
        marks = "".join(found)  # the placeholders, after the block: render() makes them markers
        return (
            f'<table width="100%" border="0" cellspacing="0" cellpadding="6" bgcolor="{p.code_background}" '
            f'style="margin-top: 4px; margin-bottom: 4px">'
            f'<tr><td><span style="color:{p.muted}; font-size: small">{label}</span></td>'
            f'<td align="right"><a href="{COPY_SCHEME}:{env["message"]}/{block}" '
            f'style="color:{p.link}; text-decoration: none">Copy</a></td></tr>'
            f'<tr><td colspan="2">{self._code_lines(lines, sources)}</td></tr></table>{marks}\n'
        )

    def _code_lines(self, lines: list[str], sources: list[str]) -> str:
        """A code block's lines (HTML, and as written), each a paragraph of its own where it wraps
        with its continuation indented under it; a blank line goes with the line before it (Qt
        leaves out an empty paragraph), those at the start with the first line."""
        chunks: list[tuple[list[str], str]] = []  # (its lines' HTML, the line its indentation is read from)
        first_blank: list[str] = []  # blank lines before the first that is not
        for line_html, source in zip(lines, sources, strict=True):
            if source.strip():
                chunks.append(([*first_blank, line_html], source))
                first_blank = []
            else:
                (chunks[-1][0] if chunks else first_blank).append(line_html)
        if first_blank:  # nothing but blank lines
            chunks.append((first_blank, ""))
        return "".join(self._code_chunk("\n".join(part), source) for part, source in chunks)

    def _code_chunk(self, part_html: str, source: str) -> str:
        """Lines of code as one paragraph, indented as ``source``; continuations of a wrapped line
        CODE_WRAP_INDENT_COLUMNS more. (Qt drops a newline at the start and the end of a <pre>.)"""
        p = self.palette
        lead = source[:len(source) - len(source.lstrip(" \t"))]
        columns = lead.count(" ") + TAB_COLUMNS * lead.count("\t") + CODE_WRAP_INDENT_COLUMNS
        indent = round(columns * p.mono_column_px)
        return (f'<pre style="font-family: \'{p.mono_family}\'; margin: 0; white-space: pre-wrap; '
                f'margin-left: {indent}px; text-indent: -{indent}px; color:{p.text}">\n{part_html}\n</pre>')

    def _code_inline(self, tokens, idx, options, env) -> str:  # noqa: ANN001
        p = self.palette
        return (f'<code style="font-family: \'{p.mono_family}\'; background-color:{p.code_background}">'
                f"{html.escape(tokens[idx].content)}</code>")

    def _image(self, tokens, idx, options, env) -> str:  # noqa: ANN001
        """Images become links: nothing is fetched or read from disk to show a reply."""
        token = tokens[idx]
        src = html.escape(token.attrGet("src") or "", quote=True)
        alt = html.escape(token.content or "image")
        return f'<a href="{src}" style="color:{self.palette.link}">[{alt}]</a>'

    def _table_open(self, tokens, idx, options, env) -> str:  # noqa: ANN001
        p = self.palette
        return (f'<table border="1" cellspacing="0" cellpadding="4" '
                f'style="border-collapse: collapse; border-color: {p.code_border}">\n')

    def _cell_open(self, tokens, idx, options, env) -> str:  # noqa: ANN001
        token = tokens[idx]
        style = token.attrGet("style") or ""
        align = {"text-align:left": "left", "text-align:center": "center", "text-align:right": "right"}
        attr = f' align="{align[style]}"' if style in align else ""
        return f"<{token.tag}{attr}>"


def preload_lexers() -> None:
    """Import the lexers of COMMON_LANGUAGES on a daemon thread (once per process)."""
    if _preloaded.is_set():
        return
    _preloaded.set()

    def load() -> None:
        for name in COMMON_LANGUAGES:
            get_lexer_by_name(name)

    threading.Thread(target=load, name="lazykv-lexers", daemon=True).start()


def plain_rich_text(text: str) -> str:
    """``text`` for a place that guesses rich text (tooltips): shown as written, never as markup."""
    return f'<p style="white-space: pre-wrap">{html.escape(text)}</p>' if text else ""


def _free_slots(text: str, n: int) -> list[str]:
    """Up to ``n`` private-use code points that ``text`` does not contain (fewer only for a text that
    holds nearly all 137,000 of them)."""
    if n == 0:
        return []
    used = set(text)
    out: list[str] = []
    for span in _SLOT_RANGES:
        for point in span:
            if chr(point) not in used:
                out.append(chr(point))
                if len(out) == n:
                    return out
    return out


def _with_placeholders(text: str, offsets: list[int], slots: list[str]) -> str:
    """``text`` with ``slots[k]`` at ``offsets[k]`` (offsets in ascending order)."""
    out, done = [], 0
    for offset, slot in zip(offsets, slots, strict=True):
        offset = max(done, min(offset, len(text)))
        out += [text[done:offset], slot]
        done = offset
    out.append(text[done:])
    return "".join(out)


def _split_tags(body: str) -> list[str]:
    """``body`` cut into its tags and the text between them, in order."""
    out, done = [], 0
    for match in _TAG.finditer(body):
        out += [body[done:match.start()], match.group()]
        done = match.end()
    out.append(body[done:])
    return out
