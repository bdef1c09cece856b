"""Branch from here (issue 47): a new conversation holding the chat on screen's messages up to and
including one of them, with its system prompt and settings, titled after it and linked to it; the chat
on screen is left as it was. The branch becomes the chat on screen at once, its KV cache made on the
engine's thread from the parent's (the live cache when the parent is the chat in the engine, else its
snapshot: ``branches.open_branch``), re-read only where that cannot be exact, and then the banner says
why, as a resume does."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from lazykv.core.engine.types import ModelInfo
from lazykv.core.history.branches import BranchResult
from lazykv.core.history.persistence import OpenResult, SaveResult
from lazykv.core.history.records import Loaded, OpChangesWithId, loaded, new_uid
from lazykv.core.history.store import Store
from lazykv.qt.elided_label import StatusBar
from lazykv.qt.ui_state import UiState
from lazykv.qt.worker import Branch, Request

if TYPE_CHECKING:
    from lazykv.qt.conversations import Chat

BRANCH_STATES = (UiState.NO_MODEL, UiState.READY)  # no reply written, no model loading


class BranchOwner(Protocol):
    """What branching uses of ``Conversations``: the chat on screen, where it is saved, and putting the
    branch in its place."""

    chat: Chat
    private: bool
    history_open: bool  # turns are written (else they wait in the window for it to open)

    @property
    def resume(self) -> Request | None: ...  # the chat on screen's cache is being made
    def execute(self, op: Callable[[Store], OpChangesWithId],
                on_done: Callable[[OpChangesWithId], None] | None, what: str) -> None: ...
    def conversation_settings(self) -> dict[str, Any]: ...
    def put_on_screen(self, loaded: Loaded) -> None: ...
    def resume_with(self, request: Request, answered: Callable[[Any], OpenResult] | None = None,
                    restored: str = "") -> None: ...
    def snapshot_saved_as(self, conv_id: int, result: SaveResult | None) -> None: ...


class BranchWindow(Protocol):
    """What branching uses of the window."""

    model_info: ModelInfo | None
    conversations: BranchOwner

    @property
    def state(self) -> UiState: ...
    def setting(self, name: str) -> Any: ...
    def statusBar(self) -> StatusBar: ...  # noqa: N802 - Qt's name


class Branching:
    """Branch from here, for the window (its ``branching``): ``branch_from`` (a message's menu),
    ``branch_last`` (the Chat menu's action and its keys)."""

    def __init__(self, host: BranchWindow) -> None:
        self.host = host

    @property
    def owner(self) -> BranchOwner:
        return self.host.conversations

    def can_branch(self) -> bool:
        """The chat on screen is saved (or on its way there) and holds a message to branch at (the
        action's check)."""
        return not self.owner.private and len(self.owner.chat.conversation) > 0

    def branch_last(self) -> None:
        self.branch_from(len(self.owner.chat.conversation) - 1)

    def why_not(self, index: int) -> str:
        """Why the chat on screen cannot be branched at turn ``index`` now ("" when it can)."""
        chat = self.owner.chat
        if self.host.state not in BRANCH_STATES:
            return "A branch can be made once the reply has ended (Stop ends it) or the model has loaded."
        if self.owner.private:
            return "A private chat is not saved, so it cannot be branched: untick Private to save it first."
        if not self.owner.history_open:
            return ("This chat is not saved yet (the conversation history is not open), so it cannot be "
                    "branched.")
        if not 0 <= index < len(chat.conversation):
            return "There is no message to branch from."
        return ""

    def branch_from(self, index: int) -> None:
        """A new conversation with the chat on screen's turns up to and including turn ``index``."""
        problem = self.why_not(index)
        if problem:
            self.host.statusBar().showMessage(problem, 8000)
            return
        parent = self.owner.chat
        conversation = parent.conversation
        turns = conversation.turns()
        system = conversation.system_prompt
        head = [{"role": "system", "content": system}] if system.strip() else []
        # the parent's whole transcript, also turns it no longer sends (dropped to fit): a branch holds
        # them, so its cache cannot be the parent's then, and is re-read (open_branch says why)
        parent_messages = head + turns
        n_messages = len(head) + index + 1
        kept = turns[: index + 1]
        stats = {i: s for i, s in conversation.stats().items() if i <= index}
        versions = {i: v for i, v in conversation.all_versions().items() if i <= index}
        markers = {i: m for i, m in conversation.markers_by_turn().items() if i <= index}
        settings = self.owner.conversation_settings()
        saved = parent.saved  # set by database jobs only: its first save may be queued before this one
        live = self.host.model_info is not None and self.owner.resume is None
        made: list[tuple[int | None, Loaded]] = []

        def job(store: Store) -> OpChangesWithId:
            changes = store.create_branch(new_uid(), saved.uid, kept, system_prompt=system,
                                          settings=settings, stats=stats, versions=versions,
                                          markers=markers)
            made.append((saved.id, loaded(store.conversation(changes.id))))
            return changes

        def done(_: OpChangesWithId) -> None:
            parent_id, branch = made[0]
            if parent is not self.owner.chat:  # another chat was chosen meanwhile: the branch is listed
                return
            self.owner.put_on_screen(branch)
            if self.host.model_info is None or parent_id is None:
                return  # its cache is read once a model has loaded (Conversations.resume_shown)
            budget = self.host.setting("snapshot_budget_mb") * 1024 * 1024
            request = Branch(parent_id, parent_messages, branch.record.id, n_messages, live, budget,
                             bool(self.host.setting("compact_snapshots")))
            self.owner.resume_with(request, lambda result: self._answered(branch.record.id, result),
                                   f"Branched from “{_parent_title(branch)}” at message {index + 1}, "
                                   "its context memory taken from the parent's")

        self.owner.execute(job, done, "Branching the conversation")

    def _answered(self, branch_id: int, result: BranchResult) -> OpenResult:
        """The Branch request's answer as the chat shows a resume's; its snapshot said as a reply's is."""
        if result.saved is not None:
            self.owner.snapshot_saved_as(branch_id, result.saved)
        elif result.save_error:
            self.host.statusBar().show_notice(
                f"The branch's snapshot was not saved ({result.save_error}); it will be re-read", 10_000)
        return OpenResult(result.how, result.note, result.n_tokens, result.seconds, result.details)


def _parent_title(branch: Loaded) -> str:
    link = branch.record.branch
    return link.parent_title if link is not None else branch.record.title

