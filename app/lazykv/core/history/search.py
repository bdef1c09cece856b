"""The conversation list and its full-text search (FTS5 over the messages and the titles)."""

from __future__ import annotations

from lazykv.core.history.connection import Connection
from lazykv.core.history.records import ConversationSummary, branch_link, shown_time

SNIPPET_MARKS = ("[", "]")  # around the matched words in ConversationSummary.snippet
SNIPPET_TOKENS = 12
# a conversation's row of the list: id, title, created, updated, number of messages; a branch's link
# (its parent's uid, title (as it is now, while it is there) and branch point, and the parent's id)
_ROW = ("SELECT c.id, c.title, c.created, c.updated,"
        " (SELECT count(*) FROM messages m WHERE m.conv_id = c.id),"
        " c.parent_uid, coalesce(p.title, c.parent_title), c.branch_at, p.id"
        " FROM conversations c LEFT JOIN conversations p ON p.uid = c.parent_uid")


def _fts_query(text: str) -> str:
    """User text as an FTS5 query that cannot be a syntax error: every word a quoted string, all
    required, the last one a prefix (so results follow typing)."""
    words = text.replace("\x00", " ").split()
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    return " ".join(quoted) + "*" if quoted else ""


def _summary(conv_id: int, title: object, created: float, updated: float, n: int,
             *link: object) -> ConversationSummary:
    return ConversationSummary(conv_id, str(title), shown_time(created), shown_time(updated), n,
                               branch=branch_link(*link))


class Listing(Connection):
    """The list operations of ``Store``: every conversation, or those a search finds."""

    def list_conversations(self) -> list[ConversationSummary]:
        """Every conversation, most recently updated first (a row with a damaged time still shows)."""
        with self._errors():
            rows = self._db.execute(_ROW + " ORDER BY c.updated DESC, c.id DESC").fetchall()
        return [_summary(*row) for row in rows]

    def summary(self, conv_id: int) -> ConversationSummary | None:
        """One conversation's row of the list (None when there is none): what an operation that changed
        it shows, read without the rest of the list (a turn's save costs the same with 50 or 5,000
        conversations)."""
        with self._errors():
            row = self._db.execute(_ROW + " WHERE c.id = ?", (conv_id,)).fetchone()
        return None if row is None else _summary(*row)

    def search(self, query: str) -> list[ConversationSummary]:
        """Conversations whose messages or title contain every word of ``query`` (the last word may be
        the start of a word), most recently updated first, each with a snippet of the best match
        (a message if one matches, else the title). Any text is safe; a blank query lists everything."""
        fts = _fts_query(query)
        if not fts:
            return self.list_conversations()
        start, end = SNIPPET_MARKS
        with self._read() as db:
            hits = db.execute(
                "SELECT conv_id, snip FROM ("
                " SELECT m.conv_id AS conv_id, snippet(messages_fts, 0, :start, :end, '…', :n) AS snip,"
                "  messages_fts.rank AS rank, 0 AS kind"
                " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
                " WHERE messages_fts MATCH :q"
                " UNION ALL"
                " SELECT titles_fts.rowid, snippet(titles_fts, 0, :start, :end, '…', :n), titles_fts.rank, 1"
                " FROM titles_fts WHERE titles_fts MATCH :q"
                ") ORDER BY kind, rank",
                {"q": fts, "start": start, "end": end, "n": SNIPPET_TOKENS},
            ).fetchall()
            snippets: dict[int, str] = {}
            for conv_id, snip in hits:
                snippets.setdefault(conv_id, snip)
            summaries = [s for s in self.list_conversations() if s.id in snippets]
        return [
            ConversationSummary(s.id, s.title, s.created, s.updated, s.n_messages, snippets[s.id], s.branch)
            for s in summaries
        ]
