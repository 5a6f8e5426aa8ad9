"""Prose routing: where an agent's plain text goes, decided per segment and per mode.

Pure: no sockets, no trio, no journal. This module is the grammar (envelopes, targets, the
locus); each mode (:mod:`mcpl_router.routing.modes`) reads a round's text with it
(``mode.segments``). The turn shell (:mod:`mcpl_router.turns.speech`) hands each round's text
to the agent's mode as the round ends, with the route in force when the words were written,
and carries out what comes back (publish, draft, count). The texts an agent reads are
:mod:`mcpl_router.routing.texts`' (section "prose routing").

The five modes (``proseRouting``), each in its own file under ``routing/modes/``:

- ``locus`` (default): everything goes to the turn's locus (:func:`locus_of`); no locus → a
  draft (``no-destination`` or ``ambiguous``). A round with an explicit send holds its text as
  drafts (``explicit-send``).
- ``explicit``: envelopes begun by ``>>target`` lines (:func:`split_envelopes`); the first valid
  target sticks for the turn; text with no target and no sticky one **bounces**.
- ``hybrid``: unprefixed text as in locus mode; ``>>> target`` lines pin a destination that
  wins over the locus; ``>>>skip_reply`` makes later unprefixed text private; a failed ``>>>``
  holds later unprefixed text as drafts until a new valid target.
- ``disabled``: nothing plain is ever posted (``>>``/``>>>`` included): suppressed.
- ``named``: nothing plain is ever posted nor handed to anyone: kept in the agent's context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Literal

import attrs

from mcpl_router.routing import texts
from mcpl_router.routing.names import KIND_AMBIGUOUS, KIND_UNKNOWN, ChannelNames, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import TurnRouting, WakeFact, own_channel_named

__all__ = [
    "EXPLICIT",
    "PIN",
    "SKIP_REPLY",
    "UNSENT",
    "Envelope",
    "LocusChoice",
    "ProseState",
    "Segment",
    "Target",
    "candidate_tokens",
    "locus_of",
    "resolve_target",
    "split_envelopes",
    "substitute_unsent",
    "target_token",
]

#: The prefix of an explicit-mode envelope line, and of a hybrid-mode one.
EXPLICIT: Final = ">>"
PIN: Final = ">>>"
#: The target that keeps an envelope private.
SKIP_REPLY: Final = "skip_reply"
#: Stands for the latest bounced draft's text in an envelope's body.
UNSENT: Final = "{{unsent}}"

# Draft reasons (stable strings, journaled).
REASON_NO_DESTINATION: Final = "no-destination"
REASON_AMBIGUOUS: Final = "ambiguous"
REASON_BOUNCED: Final = "bounced"
REASON_EXPLICIT_SEND: Final = "explicit-send"

#: How many candidates a bounce lists.
CANDIDATE_CAP: Final = 6
#: A bounce wakes the agent again at most this many times in a row.
BOUNCE_WAKE_CAP: Final = 2

Action = Literal["deliver", "draft", "bounce", "private", "suppressed", "kept"]


# ---------------------------------------------------------------------- the grammar


@attrs.frozen
class Envelope:
    """A run of text with the target its prefix line named (None: no prefix line).

    ``target`` is the token as written ("" for a ``>>>`` line that names none); ``again`` is a
    `` !`` after the target (start the next turn right after this one).
    """

    target: str | None
    body: str
    again: bool = False


def _prefix_line(line: str, prefix: str) -> tuple[str, str, bool] | None:
    """``(target, rest, again)`` when ``line`` begins an envelope under ``prefix``, else None."""
    stripped = line.lstrip()
    if not stripped.startswith(prefix):
        return None
    rest = stripped[len(prefix):]
    if prefix == EXPLICIT:
        # ">>" then a non-space: ">> text" is not a prefix.
        if not rest or rest[0].isspace():
            return None
    else:
        rest = rest.lstrip()
    token = rest.split(None, 1)[0] if rest.strip() else ""
    rest = rest[len(token):]
    again = False
    if rest.startswith(" !") and (len(rest) == 2 or rest[2].isspace()):
        again, rest = True, rest[2:]
    return token, rest.lstrip(" \t"), again


def split_envelopes(text: str, prefix: str) -> list[Envelope]:
    """Split a segment into envelopes: every prefix line begins one.

    Text before the first prefix line is its own envelope (target None). An envelope's body
    is the rest of its prefix line and the lines up to the next prefix line, trimmed at the
    ends. An envelope with no target and a blank body is dropped; one with a target is kept
    (it still moves pins), with an empty body.
    """
    envelopes: list[Envelope] = []
    target: str | None = None
    again = False
    lines: list[str] = []

    def flush() -> None:
        body = "\n".join(lines).strip()
        if target is not None or body:
            envelopes.append(Envelope(target, body, again))

    for line in text.split("\n"):
        parsed = _prefix_line(line, prefix)
        if parsed is None:
            lines.append(line)
            continue
        flush()
        target, first, again = parsed
        lines = [first] if first else []
    flush()
    return envelopes


def substitute_unsent(body: str, unsent: str) -> str:
    """``body`` with every ``{{unsent}}`` replaced by the latest bounced draft's text."""
    return body.replace(UNSENT, unsent)


# ---------------------------------------------------------------------- targets


@attrs.frozen
class Target:
    """What a target token resolves to: a channel, ``skip_reply``, or a refusal.

    ``why`` is the stable bounce reason for a refusal; ``text`` its sentence for the notice;
    ``candidates`` tokens the grammar accepts (``>>a:general``).
    """

    ref: ChannelRef | None = None
    skip: bool = False
    why: str | None = None
    text: str = ""
    candidates: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.ref is not None or self.skip


def candidate_tokens(names: ChannelNames, refs: Sequence[ChannelRef], prefix: str) -> tuple[str, ...]:
    """Each candidate written as one token the grammar accepts (:func:`target_token`), those
    no token reaches alone left out."""
    tokens = []
    for ref in refs[:CANDIDATE_CAP]:
        token = target_token(names, ref)
        if token is not None:
            tokens.append(prefix + token)
    return tuple(tokens)


def target_token(names: ChannelNames, ref: ChannelRef) -> str | None:
    """The token a ``>>``/``>>>`` line names ``ref`` by, or None where no token reaches it alone.

    Its id, else its qualified name ``serverId:channelId``, each taken only where it is one
    target token (:func:`is_target_token`), the resolver answers it with ``ref`` alone, and
    speech reads it as ``ref`` too (:func:`_read_target`: a line reads ``#x`` as a label, ``@x``
    as the name ``x``). The first check is O(1) and skips the second's refusal texts for a
    shared id, which a bounce would build for each candidate. The qualified name comes
    second, and not only where the id is shared: an id the line reads another way
    (``skip_reply`` is private speech, ``#x`` a label, an id with a space two words) leaves
    the channel reachable as ``a:skip_reply``, and offering nothing would say it isn't.
    Outside any turn's own channels, since a bounce's resend and an invitation's reply may be
    written in a later turn. The bounce's candidates and example and the invitation's reply
    all take their token here, so none offers a token that reaches another channel.
    """
    for token in (ref.channel_id, ref.qualified_name):
        if is_target_token(token) and names.picks_alone(token, ref):
            found = _read_target(token, names, counted=False)
            if isinstance(found, Resolved) and found.ref == ref:
                return token
    return None


def resolve_target(
    token: str,
    names: ChannelNames,
    routing: TurnRouting | None,
    *,
    prefix: str = EXPLICIT,
    takes_posts: Callable[[ChannelRef], bool] = lambda _ref: True,
) -> Target:
    """A target token through the one resolver, the turn's own channels first.

    Forms: ``skip_reply``; ``#label``; ``@person`` (a DM by its label); ``<@id>`` (a DM by its
    recipient's id, see :meth:`ChannelNames.dms_of_recipient`); an id, a qualified
    ``server:channel`` name or a bare label. ``routing`` is the turn's (None for a call made
    outside the turn: its own channels are not read). A channel that takes no posts is refused.
    """
    if token == SKIP_REPLY:
        return Target(skip=True)
    if not token:
        return Target(why=texts.BOUNCE_NO_TARGET, text=texts.bounce_why_no_target(prefix))
    found: Resolved | Refusal | None = None
    if routing is not None:
        found = own_channel_named(routing, token, names.registry, not_done=texts.DRAFTS_NOTHING_SENT)
    if found is None:
        found = _read_target(token, names)
    if isinstance(found, Resolved):
        if not takes_posts(found.ref):
            return Target(why=texts.BOUNCE_TAKES_NO_POSTS, text=texts.bounce_why_takes_no_posts(names.name_shown(found.ref)))
        return Target(ref=found.ref)
    if found.kind == KIND_AMBIGUOUS:
        return Target(
            why=texts.BOUNCE_AMBIGUOUS_TARGET,
            text=texts.bounce_why_ambiguous(token),
            candidates=candidate_tokens(names, found.candidates, prefix),
        )
    if found.kind == KIND_UNKNOWN:
        return Target(why=texts.BOUNCE_UNKNOWN_TARGET, text=texts.bounce_why_unknown(token))
    return Target(why=found.kind, text=found.text, candidates=candidate_tokens(names, found.candidates, prefix))


def _read_target(token: str, names: ChannelNames, *, counted: bool = True) -> Resolved | Refusal:
    """A target token's forms (``<@id>``, ``#label``, ``@person``, a name or bare label) through
    the one resolver, past ``skip_reply`` and the turn's own channels.

    One reading for :func:`resolve_target` and :func:`target_token`, so a token offered to the
    agent is read as the agent's line will be. ``counted``: whether a refusal counts in the
    resolver's metrics (False for a token only tried).
    """
    not_done = texts.DRAFTS_NOTHING_SENT
    if token.startswith("<@") and token.endswith(">") and len(token) > 3:
        # A DM by its recipient's id: one person may have a DM on each server.
        dms = names.dms_of_recipient(token[2:-1])
        if len(dms) == 1:
            return Resolved(dms[0], "dm-recipient")
        if dms:
            return names.refuse_ambiguous(token, dms, not_done=not_done)
        return names.channel_named(token, not_done=not_done, counted=counted)
    if token.startswith("#") and len(token) > 1:
        labelled = names.channels_labelled(token[1:])
        if len(labelled) == 1:
            return Resolved(labelled[0], "label")
        if labelled:
            return names.refuse_ambiguous(token, labelled, not_done=not_done)
        return names.channel_named(token[1:], not_done=not_done, counted=counted)
    name = token[1:] if token.startswith("@") and len(token) > 1 else token
    found = names.channel_named(name, not_done=not_done, counted=counted)
    if isinstance(found, Refusal) and found.kind == KIND_UNKNOWN and name == token:
        labelled = names.channels_labelled(token)
        if len(labelled) == 1:
            return Resolved(labelled[0], "label")
        if labelled:
            return names.refuse_ambiguous(token, labelled, not_done=not_done)
    return found


# ---------------------------------------------------------------------- the locus


@attrs.frozen
class LocusChoice:
    """A new turn's locus: one conversation's channel, or None; ``competing`` when held."""

    ref: ChannelRef | None
    competing: tuple[ChannelRef, ...] = ()

    @property
    def held(self) -> bool:
        return bool(self.competing)


def locus_of(wakes: Sequence[WakeFact]) -> LocusChoice:
    """Where a new turn's plain speech goes, from the wakes' conversations.

    A conversation is a channel and thread. Addressed wakes first, else all. Exactly one
    conversation → its channel; several → held (none, with the competing channels); none
    (heartbeat, timer, self-wake) → None.
    """
    with_channel = [wake for wake in wakes if wake.channel is not None]
    addressed = [wake for wake in with_channel if wake.addressed]
    pool = addressed or with_channel
    conversations = dict.fromkeys((wake.channel, wake.thread_id) for wake in pool)
    if not conversations:
        return LocusChoice(None)
    if len(conversations) == 1:
        [(ref, _thread)] = conversations
        return LocusChoice(ref)
    competing = tuple(dict.fromkeys(ref for ref, _thread in conversations if ref is not None))
    return LocusChoice(None, competing)


# ---------------------------------------------------------------------- decisions


@attrs.define
class ProseState:
    """A turn's prose-routing state, beyond its :class:`TurnRouting` (a true new turn clears it).

    ``pin`` is the sticky target (explicit: the first valid one; hybrid: the latest ``>>>``).
    ``quiet`` (hybrid): later unprefixed text private until a new valid target. ``hold``
    (hybrid): held as drafts until a new valid target. ``all_private``: ``skip_reply`` was
    called, so every later word is private. ``held_reason`` why a locus turn has no locus.
    """

    pin: ChannelRef | None = None
    quiet: bool = False
    hold: bool = False
    all_private: bool = False
    held_reason: str = REASON_NO_DESTINATION

    def with_pin(self, pin: ChannelRef | None) -> ProseState:
        """A copy with ``pin``: ``attrs.evolve(self, pin=pin)`` without its generic pass over
        the class's fields (twice a round, on every turn's path)."""
        return ProseState(pin, self.quiet, self.hold, self.all_private, self.held_reason)


@attrs.frozen
class Segment:
    """One decided piece of a round's text.

    ``action``: ``deliver`` to ``ref``; ``draft`` (``reason``); ``bounce`` (a draft with
    ``why``/``why_text``/``candidates``); ``private``; ``suppressed`` (disabled); ``kept``
    (named). ``target`` is the token its envelope named; ``pinned`` whether it went along a
    hybrid pin (a failed delivery then clears the pin and holds); ``unsent`` whether its body
    asks for the latest bounced draft; ``again`` a `` !``.
    """

    action: Action
    text: str
    ref: ChannelRef | None = None
    reason: str | None = None
    target: str | None = None
    why: str | None = None
    why_text: str = ""
    candidates: tuple[str, ...] = ()
    pinned: bool = False
    unsent: bool = False
    again: bool = False


Resolve = Callable[[str], Target]


def locus_route(text: str, locus: ChannelRef | None, state: ProseState, silenced: bool, **extra: object) -> Segment:
    if silenced:
        return Segment("draft", text, reason=REASON_EXPLICIT_SEND, **extra)  # type: ignore[arg-type]
    if locus is None:
        return Segment("draft", text, reason=state.held_reason, **extra)  # type: ignore[arg-type]
    return Segment("deliver", text, ref=locus, **extra)  # type: ignore[arg-type]


def _bounce(body: str, target: str | None, found: Target, **extra: object) -> Segment:
    return Segment(
        "bounce", body, reason=REASON_BOUNCED, target=target, why=found.why, why_text=found.text,
        candidates=found.candidates, **extra,  # type: ignore[arg-type]
    )


def decide_explicit(text: str, state: ProseState, resolve: Resolve) -> list[Segment]:
    segments: list[Segment] = []
    for envelope in split_envelopes(text, EXPLICIT):
        body, again = envelope.body, envelope.again
        unsent = UNSENT in body
        if envelope.target is None:
            if state.pin is not None:
                segments.append(Segment("deliver", body, ref=state.pin, unsent=unsent, again=again))
            else:
                segments.append(_bounce(body, None, Target(why=texts.BOUNCE_NO_TARGET, text=texts.bounce_why_no_target()),
                                        unsent=unsent))
            continue
        found = resolve(envelope.target)
        if found.skip:
            if body:
                segments.append(Segment("private", body, target=SKIP_REPLY, unsent=unsent, again=again))
            continue
        if found.ref is not None:
            if state.pin is None:
                state.pin = found.ref  # the first valid target sticks for the turn
            if body:
                segments.append(Segment("deliver", body, ref=found.ref, target=envelope.target, unsent=unsent, again=again))
            continue
        if body:
            # A bounced {{unsent}} body stands for the bounced draft (the shell substitutes it).
            segments.append(_bounce(body, envelope.target, found, again=again, unsent=unsent))
    return segments


def decide_hybrid(
    text: str, state: ProseState, locus: ChannelRef | None, resolve: Resolve, silenced: bool
) -> list[Segment]:
    """Hybrid: unprefixed text along the pin, quiet, hold or locus; ``>>>`` lines move the pin.

    ``{{unsent}}`` in a ``>>>`` envelope's body (and in text that follows its pin) stands for the
    latest bounced draft, as in explicit mode (the shell substitutes it; a delivery is recorded
    on that draft, ``>>>skip_reply {{unsent}}`` dismisses it). A body that is exactly
    ``{{unsent}}`` *is* that draft: where a send-silenced round would hold it again it stays the
    draft it is, nothing new. Unprefixed text with no ``>>>`` in force is read as in locus mode.
    """
    segments: list[Segment] = []

    def held(body: str, reason: str, **extra: object) -> None:
        if body.strip() == UNSENT:
            return  # the bounced draft is already held: holding it again would duplicate it
        segments.append(Segment("draft", body, reason=reason, unsent=UNSENT in body, **extra))  # type: ignore[arg-type]

    for envelope in split_envelopes(text, PIN):
        body = envelope.body
        unsent = UNSENT in body
        if envelope.target is None:
            if not body:
                continue
            if state.pin is not None:
                if silenced:
                    held(body, REASON_EXPLICIT_SEND)
                else:
                    segments.append(Segment("deliver", body, ref=state.pin, pinned=True, unsent=unsent))
            elif state.quiet:
                segments.append(Segment("private", body))
            elif state.hold:
                segments.append(Segment("draft", body, reason=REASON_NO_DESTINATION))
            else:
                # No >>> in force: as in locus mode, the words are read as written.
                segments.append(locus_route(body, locus, state, silenced))
            continue
        found = resolve(envelope.target)
        if found.skip:
            state.pin, state.quiet, state.hold = None, True, False
            if body:
                # ">>>skip_reply {{unsent}}" sets the latest bounced draft aside (dismissed).
                segments.append(Segment("private", body, target=SKIP_REPLY, unsent=unsent))
            continue
        if found.ref is not None:
            state.pin, state.quiet, state.hold = found.ref, False, False
            if body:
                if silenced:
                    held(body, REASON_EXPLICIT_SEND, target=envelope.target)
                else:
                    segments.append(Segment("deliver", body, ref=found.ref, target=envelope.target, pinned=True, unsent=unsent))
            continue
        # A failed >>>: the pin goes, and later unprefixed text is held until a new target.
        state.pin, state.quiet, state.hold = None, False, True
        if body:
            segments.append(_bounce(body, envelope.target, found, pinned=True, unsent=unsent))
    return segments


def example_target(
    candidates: Sequence[str], prefix: str, names: ChannelNames, fallback: ChannelRef | None
) -> str:
    """The target written in a bounce's resend example: the first candidate, else the token
    that reaches ``fallback`` (the turn's trigger) alone (:func:`target_token`: its id, else its
    qualified name), else a placeholder, since a token read another way (``skip_reply``, a
    name with a space) would make the example say something else."""
    if candidates:
        return candidates[0][len(prefix):]
    token = target_token(names, fallback) if fallback is not None else None
    return token if token is not None else "<channel>"


def is_target_token(picked: str | None) -> bool:
    """Whether a string can be written as one ``>>``/``>>>`` target token: not empty, not
    ``skip_reply`` (which the line reads as private speech), no whitespace (which ends it)."""
    return picked is not None and picked not in ("", SKIP_REPLY) and not any(char.isspace() for char in picked)
