"""The session tree (design §2.2, 2.3): pure state, no I/O.

Messages, compactions, overlays and visibility changes are nodes linked to their parent; the *leaf* is where the next
message goes, and the nodes from the root to the leaf are the *path*: the conversation. ``branch`` moves
the leaf to any node, so a new message starts a sibling branch; nothing is ever removed.

Two views are computed from the path:

* :meth:`SessionTree.messages` — what a user sees: every message of the path with overlays applied, and
  each compaction's summary as a marker where it happened.
* :meth:`SessionTree.context` — what the model sees: for the latest compaction on the path, its summary,
  then the path's messages from its ``first_kept_id`` up to it, then everything after it; overlays
  applied and ``agent_visible=False`` messages left out.

Every mutating method builds an entry and hands it to :meth:`SessionTree.apply`, the one code path
that replay from a log uses as well, so a replayed tree is the tree that wrote the log. The views of the
current path are cached and extended in O(1) when a message is appended to the leaf; a branch move,
compaction or overlay makes them rebuild once, lazily.

Memory bounded by the context (design §2.2): :meth:`SessionTree.trim` drops every node the model's view
no longer needs — the path before the latest compaction's kept part, and every other branch — keeping
the log (the source of truth) as the only copy. What stays is the path from there to the leaf, the
number of user-view messages dropped before it (:attr:`SessionTree.messages_before`) and an index of the
dropped ids (8 bytes each). A trimmed tree answers what the running session needs; anything that needs
a dropped node (a branch to it, a new root, an overlay of it, a duplicate of its id, :meth:`entries`)
raises :class:`NeedsHistory`, and its owner rebuilds the whole tree from the log and asks again.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from runtime.errors import StoreError
from runtime.events import CompactionMode, CompactionTrigger, OverflowCause
from runtime.messages import Message, Usage
from runtime.store.entries import (
    BranchEntry,
    CompactionEntry,
    Entry,
    Header,
    MessageEntry,
    MetadataEntry,
    NodeEntry,
    OverlayEntry,
    StepEntry,
    VisibilityEntry,
)

__all__ = ["DEAD_KEY", "SPEND_KEY", "TURN_ENDED_KEY", "NeedsHistory", "SessionTree"]


DEAD_KEY = "dead"
TURN_ENDED_KEY = "turn_ended_at"  # metadata: the newest message when a turn ended without an answer
SPEND_KEY = "unlogged_spend"
"""Metadata: what compactions that wrote no summary spent (a :class:`~runtime.messages.Usage`) since the newest
compaction entry, which carries it in its summary's usage and so clears it (design §4.1)."""
"""Metadata key marking a dead session (its value is the reason; an empty value revives it)."""


class NeedsHistory(StoreError, LookupError):
    """A trimmed tree cannot answer: the node asked for may be one it dropped (it is in the log). The owner
    rebuilds the whole tree from the log and asks again; the tree was left unchanged."""


class _DroppedIds:
    """The ids a trimmed tree dropped, as 64-bit hashes in a few sorted arrays (8 bytes an id).

    ``in`` answers "maybe" (a hash collision is a false positive, which only costs a read of the log),
    never a false "no". Runs are merged as they come so there are O(log n) of them.
    """

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: list[array[int]] = []

    def add(self, ids: Iterable[str]) -> None:
        run = array("q", sorted({hash(i) for i in ids}))
        if not run:
            return
        runs = self._runs
        runs.append(run)
        while len(runs) > 1 and len(runs[-2]) <= 2 * len(runs[-1]):
            newer, older = runs.pop(), runs.pop()
            runs.append(array("q", heapq.merge(older, newer)))

    def __contains__(self, node_id: object) -> bool:
        h = hash(node_id)
        for run in self._runs:
            i = bisect.bisect_left(run, h)
            if i < len(run) and run[i] == h:
                return True
        return False

    def __len__(self) -> int:
        return sum(len(run) for run in self._runs)


class SessionTree:
    """One session's messages as a tree with a current leaf. Not thread-safe: one owner (the store actor)."""

    def __init__(self, header: Header | None = None) -> None:
        self.header: Header | None = None
        self._applied: list[Entry] | None = []  # None once trimmed: the log holds them
        self._entry_count = 0
        # What trim() dropped: the last dropped node of the path (the kept path hangs from it), how many
        # user-view messages the path has before the kept part, and the dropped ids.
        self._base_id: str | None = None
        self._before = 0
        self._dropped = _DroppedIds()
        self._nodes: dict[str, NodeEntry] = {}
        self._children: dict[str | None, list[str]] = {}
        self._metadata: dict[str, Any] = {}
        # What the session paid for, as the log records it (design §4.1): summed as entries are applied, so
        # a replay (which every open does) knows it with no other read, and trim() keeps it.
        self._spent = Usage()
        self._unlogged: Usage | None = None  # SPEND_KEY's value, decoded once
        self._steps: list[StepEntry] = []  # the newest turn's step records (design §3.12)
        self._leaf: str | None = None
        self._message_count = 0
        self._compaction_count = 0
        # The current path and what is derived from it. ``_path_valid`` false: rebuild on next use.
        self._path_valid = True
        self._path: list[NodeEntry] = []
        self._index: dict[str, int] = {}  # node id -> position on the path
        self._overlays: dict[str, Message] = {}  # message id -> its replacement on this path
        self._compaction_pos: int | None = None  # position of the latest compaction on the path
        # Cached views; ``None``: rebuild from the path on next use.
        self._context: list[Message] | None = []
        self._usage_floor = 0
        self._messages: list[Message] | None = []
        if header is not None:
            self.apply(header)

    @classmethod
    def from_entries(cls, entries: Iterable[Entry]) -> SessionTree:
        """Rebuild a tree by applying ``entries`` in order (raises ``ValueError`` on an inconsistent one)."""
        tree = cls()
        for entry in entries:
            tree.apply(entry)
        return tree

    # -- mutations: each builds an entry and applies it ------------------------------------------------

    def append(self, message: Message, parent_id: str | None = None) -> MessageEntry:
        """Add ``message`` as a child of ``parent_id`` (default: the current leaf); it becomes the leaf."""
        entry = MessageEntry(
            id=message.id, parent_id=self._leaf if parent_id is None else parent_id, message=message
        )
        self.apply(entry)
        return entry

    def record_compaction(
        self,
        summary: Message,
        first_kept_id: str | None,
        *,
        tokens_before: int = 0,
        tokens_after: int = 0,
        mode: CompactionMode = "summarize",
        trigger: CompactionTrigger = "threshold",
        artifacts: Sequence[str] = (),
        cause: OverflowCause | None = None,
    ) -> CompactionEntry:
        """Record a compaction as a child of the current leaf.

        ``first_kept_id`` names the node of the current path from which history is kept verbatim
        (usually a message of :meth:`context`); ``None`` means the summary replaces everything before it.
        """
        entry = CompactionEntry(
            id=summary.id,
            parent_id=self._leaf,
            summary=summary,
            first_kept_id=first_kept_id,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            mode=mode,
            trigger=trigger,
            artifacts=list(artifacts),
            cause=cause,
        )
        self.apply(entry)
        return entry

    def overlay(self, replacements: Iterable[Message]) -> OverlayEntry:
        """Replace messages of the current path, by id, in both views (the originals are kept)."""
        entry = OverlayEntry(parent_id=self._leaf, replacements=list(replacements))
        self.apply(entry)
        return entry

    def set_visibility(
        self,
        message_ids: Iterable[str],
        *,
        agent_visible: bool | None = None,
        user_visible: bool | None = None,
    ) -> VisibilityEntry:
        """Show or hide messages of the current path, by id, to the model or the user (the originals are
        kept, and the entry holds only their ids)."""
        entry = VisibilityEntry(
            parent_id=self._leaf,
            message_ids=list(message_ids),
            agent_visible=agent_visible,
            user_visible=user_visible,
        )
        self.apply(entry)
        return entry

    def branch(self, leaf_id: str | None) -> BranchEntry:
        """Move the leaf to the node ``leaf_id`` (``None``: before the first message)."""
        entry = BranchEntry(leaf_id=leaf_id)
        self.apply(entry)
        return entry

    def set_metadata(self, key: str, value: Any) -> MetadataEntry:
        """Record a session-level setting, e.g. ``("model", "gpt-4o")``."""
        entry = MetadataEntry(key=key, value=value)
        self.apply(entry)
        return entry

    def apply(self, entry: Entry) -> None:
        """Apply one entry: the single code path of both live changes and replay.

        Raises ``ValueError`` (and changes nothing) when the entry does not fit the tree: a duplicate id,
        an unknown parent or leaf, a kept id or replacement that is not on the path.
        """
        match entry:
            case MessageEntry():
                if entry.id != entry.message.id:
                    raise ValueError(
                        f"message entry {entry.id!r} holds a message with id {entry.message.id!r}"
                    )
                self._attach(entry)
                self._message_count += 1
                if entry.message.usage is not None:
                    self._spent = self._spent + entry.message.usage
            case CompactionEntry():
                self._attach(entry)
                self._compaction_count += 1
                self._metadata.pop(SPEND_KEY, None)  # (its summary carries it)
                self._unlogged = None
                if entry.summary.usage is not None:
                    self._spent = self._spent + entry.summary.usage
            case OverlayEntry() | VisibilityEntry():
                self._attach(entry)
            case BranchEntry():
                self._move_leaf(entry.leaf_id)
            case MetadataEntry():
                self._metadata[entry.key] = entry.value
                if entry.key == SPEND_KEY:
                    self._unlogged = _usage_of(entry.value)
            case StepEntry():
                if entry.kind == "turn" or (self._steps and self._steps[0].turn_id != entry.turn_id):
                    self._steps = []  # a new turn: the records of the one before are done with
                self._steps.append(entry)
            case Header():
                if self._entry_count:
                    raise ValueError("a header must be the first entry of a session")
                self.header = entry
            case _:
                raise ValueError(f"not a session entry: {type(entry).__name__}")
        self._entry_count += 1
        if self._applied is not None:
            self._applied.append(entry)

    # -- queries --------------------------------------------------------------------------------------

    @property
    def leaf_id(self) -> str | None:
        """The node the next message is appended to (``None``: an empty path)."""
        return self._leaf

    @property
    def metadata(self) -> dict[str, Any]:
        """The latest value of every metadata key (a copy)."""
        return dict(self._metadata)

    @property
    def dead(self) -> str | None:
        """Why the session is dead (design §5.8: hard_reset could not bring it under its window), or None."""
        value = self._metadata.get(DEAD_KEY)
        return value if isinstance(value, str) and value else None

    @property
    def unlogged_spend(self) -> Usage | None:
        """What compactions that wrote no summary spent since the newest compaction entry, or None
        (:data:`SPEND_KEY`)."""
        return self._unlogged

    @property
    def spent(self) -> Usage:
        """What the session paid for, as its log records it (design §4.1): the usage of every message of
        every branch (its responses, an archive's tool summary), of every compaction's summary (its
        summarizer calls, and those of earlier compactions that wrote none) and :attr:`unlogged_spend`.
        Overlays are copies of messages already counted: not counted again."""
        unlogged = self._unlogged
        return self._spent if unlogged is None else self._spent + unlogged

    @property
    def turn_ended_at(self) -> str | None:
        """The newest model-facing message when the latest turn ended without a final answer (an error or an
        abort), or None."""
        value = self._metadata.get(TURN_ENDED_KEY)
        return value if isinstance(value, str) else None

    @property
    def turn_steps(self) -> tuple[StepEntry, ...]:
        """The step records of the newest turn that wrote any, oldest first (design §3.12)."""
        return tuple(self._steps)

    @property
    def model(self) -> str | None:
        """The session's current model: the latest ``model`` metadata, else the header's."""
        value = self._metadata.get("model")
        if isinstance(value, str):
            return value
        return self.header.model if self.header is not None else None

    @property
    def compaction_count(self) -> int:
        """Compactions recorded in the whole tree (every branch)."""
        return self._compaction_count

    @property
    def latest_compaction(self) -> CompactionEntry | None:
        """The latest compaction on the current path."""
        self._ensure_path()
        if self._compaction_pos is None:
            return None
        node = self._path[self._compaction_pos]
        assert isinstance(node, CompactionEntry)
        return node

    def __len__(self) -> int:
        """The number of messages in the whole tree (every branch; summaries not counted)."""
        return self._message_count

    def __contains__(self, node_id: object) -> bool:
        """Whether ``node_id`` is in memory (a trimmed tree may have dropped it: see :meth:`has`)."""
        return node_id in self._nodes

    def has(self, node_id: str) -> bool:
        """Whether the session has the node ``node_id``; raises :class:`NeedsHistory` when it may be one
        that :meth:`trim` dropped."""
        if node_id in self._nodes:
            return True
        if node_id in self._dropped:
            raise NeedsHistory(f"node {node_id!r} may be in the part of the history kept only in the log")
        return False

    @property
    def trimmed(self) -> bool:
        """Whether :meth:`trim` dropped nodes (the log holds the whole tree)."""
        return self._applied is None

    @property
    def messages_before(self) -> int:
        """User-view messages of the path before the part in memory (0 unless trimmed)."""
        return self._before

    @property
    def entry_count(self) -> int:
        """Entries applied so far (the log's lines)."""
        return self._entry_count

    def trim(self) -> int:
        """Drop from memory every node the model's view does not need; returns how many were dropped.

        Kept: the path from where the latest compaction's view begins (its kept part, or the summary) to
        the leaf. Dropped: the path before it and every other branch; they stay in the log. Without a
        compaction on the path only other branches can go.
        """
        self._ensure_path()
        start = self._window_start()
        kept = self._path[start:]
        if len(kept) == len(self._nodes):
            return 0
        kept_ids = {node.id for node in kept}
        self._dropped.add(i for i in self._nodes if i not in kept_ids)
        dropped = len(self._nodes) - len(kept)
        if start:
            self._before += sum(isinstance(n, MessageEntry | CompactionEntry) for n in self._path[:start])
            self._base_id = self._path[start - 1].id
        self._nodes = {node.id: node for node in kept}
        children: dict[str | None, list[str]] = {}
        for node in kept:
            children.setdefault(node.parent_id, []).append(node.id)
        self._children = children
        self._path = list(kept)
        self._index = {node.id: i for i, node in enumerate(kept)}
        self._overlays = {k: v for k, v in self._overlays.items() if k in self._nodes}
        if self._compaction_pos is not None:
            self._compaction_pos -= start
        self._context = None
        self._messages = None
        self._applied = None
        return dropped

    def _window_start(self) -> int:
        """Position on the path where the model's view begins (0 without a compaction)."""
        position = self._compaction_pos
        if position is None:
            return 0
        while True:
            node = self._path[position]
            assert isinstance(node, CompactionEntry)
            if node.first_kept_id is None:
                return position
            start = self._index[node.first_kept_id]
            if not isinstance(self._path[start], CompactionEntry):
                return start
            position = start

    def get(self, node_id: str) -> NodeEntry | None:
        """The node ``node_id`` as it was recorded (an overlaid message's original), or ``None``."""
        return self._nodes.get(node_id)

    def children(self, node_id: str | None) -> list[str]:
        """Ids of the nodes whose parent is ``node_id`` (``None``: the roots), oldest first."""
        return list(self._children.get(node_id, ()))

    def entries(self) -> list[Entry]:
        """Every entry applied so far, in order: what the log holds (:class:`NeedsHistory` once trimmed)."""
        if self._applied is None:
            raise NeedsHistory("the tree is trimmed: its entries are in the log")
        return list(self._applied)

    def path(self) -> list[NodeEntry]:
        """The nodes from the root to the leaf."""
        self._ensure_path()
        return list(self._path)

    def messages(self) -> list[Message]:
        """The user's view: the path's messages with overlays applied, compaction summaries as markers.

        Hidden messages are included; a renderer skips those with ``user_visible=False``. In a trimmed
        tree, the part in memory: the first :attr:`messages_before` are in the log.
        """
        self._ensure_path()
        if self._messages is None:
            self._messages = [
                self._user_message(node)
                for node in self._path
                if isinstance(node, MessageEntry | CompactionEntry)
            ]
        return list(self._messages)

    def context(self) -> list[Message]:
        """The model's view of the path (see the module docstring)."""
        return list(self._ensure_context())

    def context_snapshot(self) -> tuple[Message, ...]:
        """:meth:`context` as an immutable tuple (one copy), safe to hand to another thread."""
        return tuple(self._ensure_context())

    @property
    def usage_floor(self) -> int:
        """Index of the first message of :meth:`context` appended after the latest compaction.

        Everything before it (the summary and the kept messages) predates the compaction, so provider
        usage reported for it must be ignored (design §4.2). ``0`` when the path has no compaction.
        """
        self._ensure_context()
        return self._usage_floor

    def context_since_compaction(self) -> list[Message]:
        """The messages of :meth:`context` appended after the latest compaction."""
        return self._ensure_context()[self._usage_floor :]

    def copy(self) -> SessionTree:
        """An independent tree with the same entries (:class:`NeedsHistory` once trimmed)."""
        return SessionTree.from_entries(self.entries())

    # -- internals ------------------------------------------------------------------------------------

    def _attach(self, node: NodeEntry) -> None:
        if self.has(node.id):
            raise ValueError(f"node id {node.id!r} is already in the session")
        parent = node.parent_id
        if parent is not None and not self.has(parent):
            raise ValueError(f"parent {parent!r} of {node.id!r} is not in the session")
        if parent is None and self._base_id is not None:
            raise NeedsHistory("a new root: the path would leave the part of the history in memory")
        if isinstance(node, CompactionEntry) and node.first_kept_id is not None:
            if self._on_path(parent, node.first_kept_id) is None:
                raise ValueError(f"compaction keeps from {node.first_kept_id!r}, which is not on the path")
        elif isinstance(node, OverlayEntry):
            for message in node.replacements:
                if not isinstance(self._on_path(parent, message.id), MessageEntry):
                    raise ValueError(f"overlay replaces {message.id!r}, which is not a message on the path")
        elif isinstance(node, VisibilityEntry):
            for message_id in node.message_ids:
                if not isinstance(self._on_path(parent, message_id), MessageEntry):
                    raise ValueError(f"visibility of {message_id!r}, which is not a message on the path")
        if parent != self._leaf:
            self._leaf = parent
            self._invalidate_path()
        self._nodes[node.id] = node
        self._children.setdefault(parent, []).append(node.id)
        self._leaf = node.id
        if not self._path_valid:
            return
        self._index[node.id] = len(self._path)
        self._path.append(node)
        if isinstance(node, MessageEntry):
            if self._context is not None and node.message.agent_visible:
                self._context.append(node.message)
            if self._messages is not None:
                self._messages.append(node.message)
        elif isinstance(node, CompactionEntry):
            self._compaction_pos = len(self._path) - 1
            self._context = None
            if self._messages is not None:
                self._messages.append(node.summary)
        else:
            self._apply_overlay(node)
            self._context = None
            self._messages = None

    def _on_path(self, leaf_id: str | None, node_id: str) -> NodeEntry | None:
        """The node ``node_id`` if it lies on the path from the root to ``leaf_id``."""
        if leaf_id == self._leaf:
            self._ensure_path()
            position = self._index.get(node_id)
            if position is None:
                self._not_on_path(node_id)
                return None
            return self._path[position]
        while leaf_id is not None and leaf_id != self._base_id:
            node = self._nodes[leaf_id]
            if leaf_id == node_id:
                return node
            leaf_id = node.parent_id
        self._not_on_path(node_id)
        return None

    def _not_on_path(self, node_id: str) -> None:
        """Raise :class:`NeedsHistory` when ``node_id``, not found on the path in memory, may be a dropped one."""
        if node_id in self._dropped:
            raise NeedsHistory(f"node {node_id!r} may be on the part of the path kept only in the log")

    def _move_leaf(self, leaf_id: str | None) -> None:
        if leaf_id is not None and not self.has(leaf_id):
            raise ValueError(f"cannot branch to {leaf_id!r}: no such node in the session")
        if leaf_id is None and self._base_id is not None:
            raise NeedsHistory("a branch to the start leaves the part of the history in memory")
        if leaf_id != self._leaf:
            self._leaf = leaf_id
            self._invalidate_path()

    def _invalidate_path(self) -> None:
        self._path_valid = False
        self._context = None
        self._messages = None

    def _ensure_path(self) -> None:
        if self._path_valid:
            return
        path: list[NodeEntry] = []
        node_id = self._leaf
        while node_id is not None and node_id != self._base_id:
            node = self._nodes[node_id]
            path.append(node)
            node_id = node.parent_id
        path.reverse()
        self._path = path
        self._index = {node.id: i for i, node in enumerate(path)}
        self._overlays = {}
        self._compaction_pos = None
        for i, node in enumerate(path):
            if isinstance(node, OverlayEntry | VisibilityEntry):
                self._apply_overlay(node)
            elif isinstance(node, CompactionEntry):
                self._compaction_pos = i
        self._path_valid = True

    def _apply_overlay(self, node: OverlayEntry | VisibilityEntry) -> None:
        """Record what ``node`` replaces on the path, over what earlier overlays replaced."""
        if isinstance(node, OverlayEntry):
            self._overlays.update((m.id, m) for m in node.replacements)
            return
        changes: dict[str, Any] = {}
        if node.agent_visible is not None:
            changes["agent_visible"] = node.agent_visible
        if node.user_visible is not None:
            changes["user_visible"] = node.user_visible
        for message_id in node.message_ids:
            original = self._nodes.get(message_id)
            if original is None:  # dropped by trim(): before the part of the path in memory
                continue
            assert isinstance(original, MessageEntry)
            current = self._overlays.get(message_id, original.message)
            self._overlays[message_id] = msgspec.structs.replace(current, **changes)

    def _ensure_context(self) -> list[Message]:
        self._ensure_path()
        if self._context is None:
            if self._compaction_pos is None:
                self._usage_floor = 0
                self._context = self._visible(0, len(self._path))
            else:
                head = self._compacted_view(self._compaction_pos)
                self._usage_floor = len(head)
                head.extend(self._visible(self._compaction_pos + 1, len(self._path)))
                self._context = head
        return self._context

    def _compacted_view(self, position: int) -> list[Message]:
        """The compaction at ``position``: its summary, then what it keeps verbatim."""
        node = self._path[position]
        assert isinstance(node, CompactionEntry)
        view = [node.summary]
        if node.first_kept_id is None:
            return view
        start = self._index[node.first_kept_id]
        if isinstance(self._path[start], CompactionEntry):
            # Kept from an earlier summary: keep that compaction's own view, then what followed it.
            view.extend(self._compacted_view(start))
            start += 1
        view.extend(self._visible(start, position))
        return view

    def _visible(self, start: int, stop: int) -> list[Message]:
        """Agent-visible messages (overlays applied) of ``path[start:stop]``; other nodes skipped."""
        overlays = self._overlays
        out: list[Message] = []
        for node in self._path[start:stop]:
            if isinstance(node, MessageEntry):
                message = overlays.get(node.id, node.message) if overlays else node.message
                if message.agent_visible:
                    out.append(message)
        return out

    def _user_message(self, node: NodeEntry) -> Message:
        if isinstance(node, CompactionEntry):
            return node.summary
        assert isinstance(node, MessageEntry)
        return self._overlays.get(node.id, node.message)


def _usage_of(value: Any) -> Usage | None:
    """A :class:`Usage` recorded as metadata, or None when it is not one."""
    if not isinstance(value, dict):
        return None
    try:
        return msgspec.convert(value, Usage)
    except msgspec.ValidationError:
        return None
