"""Every text the routing core gives an agent, a host or a server, in one place and one voice.

Rules every text here keeps:

- A refusal says what was not done (the caller passes that phrase, e.g. ``"Nothing was sent."``,
  since only the caller knows what it would have done) and what would work instead.
- A name several channels answer to is never called "not found": a host reads "not found" as
  an absent server. It "is on more than one server", or "could mean more than one channel on
  server" s.
- A channel is written as the name that picks it alone, or, where no string does, in the
  id-and-server form of :func:`unnamed_channel`, which carries its own quotes and is visibly
  not a name.
- Ids and server ids are quoted as JSON strings, so an id holding a quote or a space can't blur
  into the sentence around it.

The registry's reasons for refusing a server's descriptor or message are here too: they reach
the server in ``{results: [{id, accepted, reason}]}`` and the operator in the logs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

__all__ = [
    "NOTHING_DONE",
    "quoted",
    "unnamed_channel",
]

#: The default "what was not done" phrase, for a caller with nothing more exact to say.
NOTHING_DONE: Final = "Nothing was done."


def quoted(text: str) -> str:
    """``text`` as a JSON string literal: ``general`` → ``"general"``."""
    return json.dumps(text, ensure_ascii=False)


# ---------------------------------------------------------------------- shown forms


def unnamed_channel(channel_id: str, server_id: str) -> str:
    """How a channel no string picks alone is shown: ``"b:room" on server "a"``.

    Visibly not a name: it holds quotes and spaces, where a name is an id or ``server:id``
    given as one token. (A server could in principle register an id spelled exactly like this
    form; the resolver would then match it as that id. No real server's ids look like this.)
    """
    return f"{quoted(channel_id)} on server {quoted(server_id)}"


def route_for(channel_id: str, server_id: str) -> str:
    """The route to a channel through a tool that takes both fields."""
    return f"channelId {quoted(channel_id)} with serverId {quoted(server_id)}"


# ---------------------------------------------------------------------- agent-facing refusals


def candidate_line(name: str) -> str:
    """One candidate of a refusal, by the name that picks it alone."""
    return f"- {name}"


def route_line(channel_id: str, server_id: str, *, server_id_accepted: bool) -> str:
    """One candidate no string picks alone, with its route (or the lack of one)."""
    shown = unnamed_channel(channel_id, server_id)
    if server_id_accepted:
        return f"- {shown}: no name picks it alone; give {route_for(channel_id, server_id)}"
    # A tool whose schema has no serverId can't reach such a channel; say so rather than
    # offer a route the tool can't take.
    return f"- {shown}: no channelId reaches it alone"


def ambiguous_across_servers(name: str, lines: Sequence[str], not_done: str) -> str:
    """A name channels on several servers answer to."""
    return (
        f"{quoted(name)} is on more than one server, so it doesn't say which channel you mean."
        f" {not_done} Name the one you mean:\n" + "\n".join(lines)
    )


def ambiguous_on_server(name: str, server_id: str, lines: Sequence[str], not_done: str) -> str:
    """A name several channels of one server answer to (its ``s:room`` and its ``room``)."""
    return (
        f"{quoted(name)} could mean more than one channel on server {quoted(server_id)}."
        f" {not_done} Name the one you mean:\n" + "\n".join(lines)
    )


def unknown_name(name: str, shown: Sequence[str], more: int, not_done: str) -> str:
    """A name no channel answers to, with a short list of what exists."""
    if not shown:
        return (
            f"No channel answers to {quoted(name)}: no server has registered a channel yet."
            f" {not_done} Try again once a server has registered its channels."
        )
    listing = ", ".join(shown)
    if more:
        listing += f", and {more} more"
    return (
        f"No channel answers to {quoted(name)}. {not_done} Channels registered now: {listing}."
        " channel_list lists every channel with its server."
    )


def not_on_server(name: str, server_id: str, places: Sequence[str], not_done: str) -> str:
    """A ``serverId`` given with an id that server doesn't have.

    ``places`` describe each server that has the id (see :func:`place_by_name` and
    :func:`place_by_route`).
    """
    head = f"Server {quoted(server_id)} has no channel {quoted(name)}. {not_done}"
    if not places:
        return (
            f"{head} No server has a channel {quoted(name)}."
            " channel_list lists every channel with its server."
        )
    if len(places) == 1:
        return f"{head} A channel {quoted(name)} is on {places[0]}."
    return f"{head} A channel {quoted(name)} is on " + ", ".join(places[:-1]) + f" and {places[-1]}."


def place_by_name(server_id: str, name: str) -> str:
    """Where a channel is, with the name that picks it alone."""
    return f"server {quoted(server_id)} (name it {name})"


def place_by_route(channel_id: str, server_id: str, *, server_id_accepted: bool) -> str:
    """Where a channel is that no string picks alone."""
    if server_id_accepted:
        return f"server {quoted(server_id)} (give {route_for(channel_id, server_id)})"
    return f"server {quoted(server_id)} (no channelId reaches it alone)"


def qualified_with_server(name: str, server_id: str, target_channel: str, target_server: str,
                          not_done: str) -> str:
    """A qualified name given with a ``serverId``: that pair is no channel, the name alone is."""
    return (
        f"Server {quoted(server_id)} has no channel {quoted(name)}. {not_done}"
        f" {quoted(name)} on its own already names channel {quoted(target_channel)} on server"
        f" {quoted(target_server)}: give it as channelId without serverId."
    )


def no_name(not_done: str) -> str:
    """A call that named no channel where one was needed."""
    return f"No channel was named. {not_done} Give a channel's name as channelId; channel_list lists them."


# ---------------------------------------------------------------------- explain's rules

_RULE_TEXTS: Final = {
    "exact-pair": "serverId with channelId names exactly that pair",
    "one-match": "exactly one channel answers to the name, by its id, its serverId:channelId"
    " or a DM's label",
    "ambiguous": "more than one channel answers to the name, so it is refused, naming each"
    " candidate by the name that picks it alone, or by its route where no name does",
    "unknown": "no channel answers to the name",
    "not-on-server": "serverId with channelId names exactly that pair, and that server has no"
    " such channel",
    "qualified-with-server": "a serverId:channelId name was given with a serverId; that pair is"
    " no channel, and the name alone is one",
    "no-name": "no name was given",
}


def rule_text(rule: str) -> str:
    """What a resolver rule (or refusal kind) means, in words, for ``explain``."""
    return _RULE_TEXTS.get(rule, rule)


# ---------------------------------------------------------------------- server-facing reasons

REASON_REGISTER_NOT_GRANTED: Final = "channels.register is not granted to this server"
REASON_DUPLICATE_IN_CALL: Final = (
    "this id appears more than once in the call, so none of its descriptors was registered"
)
REASON_UPDATE_UNKNOWN: Final = "this server has not registered this channel, so it can't be updated"
REASON_INCOMING_NOT_GRANTED: Final = "channels.incoming is not granted to this server"
REASON_PUSH_NAMES_NO_CHANNEL: Final = "the push names no channel"


def reason_malformed(detail: str) -> str:
    """A descriptor that could not be read."""
    return f"malformed channel descriptor: {detail}"


def reason_outside_patterns(channel_id: str) -> str:
    """An id outside the server's configured id patterns."""
    return f"channel id {quoted(channel_id)} is outside the ids this server may use"


def reason_incoming_unknown(channel_id: str) -> str:
    """A message for a channel the sending server never registered (another's doesn't count)."""
    return f"channel {quoted(channel_id)} is not registered by this server"


def reason_incoming_outside_patterns(channel_id: str) -> str:
    """A message for a channel outside the server's current id patterns."""
    return f"channel {quoted(channel_id)} is outside the ids this server may receive on"


def reason_incoming_outbound(channel_id: str) -> str:
    """A message for a channel its server declared outbound-only."""
    return f"channel {quoted(channel_id)} is outbound-only"


def reason_native_unknown(native_id: str) -> str:
    """A push's native id that none of the pushing server's channels has in its address."""
    return f"no channel of this server has native id {quoted(native_id)}"


def reason_native_ambiguous(native_id: str) -> str:
    """A push's native id that several of the pushing server's channels have."""
    return f"more than one channel of this server has native id {quoted(native_id)}"


# ---------------------------------------------------------------------- turns (host API)

MALFORMED_REF_SERVER: Final = (
    "channel: a ref needs a non-empty serverId; to name a channel without its server, give"
    " the name as a string"
)
MALFORMED_REF_CHANNEL: Final = "channel: a ref needs a non-empty channelId"

#: What a turn's undelivered words are, in the receipt.
NOTHING_POSTED: Final = "Nothing was posted."


def own_channel_withdrawn(channel_id: str, server_id: str, not_done: str) -> str:
    """A turn's own channel its server no longer registers: never read as another server's."""
    return (
        f"Channel {quoted(channel_id)} on server {quoted(server_id)}, where this turn has been,"
        f" is no longer registered by that server. {not_done} Nothing can reach it until server"
        f" {quoted(server_id)} registers it again."
    )


def speech_lands_in(shown: str) -> str:
    """The routing line a turn is shown when its plain speech has a destination."""
    return f"[routing] Your plain speech now lands in {shown}."


SPEECH_HAS_NO_DESTINATION: Final = (
    "[routing] This turn has no channel, so your plain speech is not posted anywhere."
    " Use channel_publish with a channelId to speak in a channel."
)


def receipt(delivered: Sequence[str], held: int, failed: Sequence[str], unknown: Sequence[str]) -> str:
    """The turn's receipt: where plain speech went, then notes on what didn't go."""
    text = "[delivered] " + (", ".join(dict.fromkeys(delivered)) if delivered else "nothing")
    if held:
        text += f"\n{held} segment(s) had no destination and were held, not posted."
    if failed:
        text += "\nNot delivered (the server refused or was unreachable): " + ", ".join(failed) + "."
    if unknown:
        text += (
            "\nDelivery not confirmed: " + ", ".join(unknown) + ". Check the channel before"
            " sending the same words again."
        )
    return text


def unknown_tool(name: str) -> str:
    """A tool call the daemon offers no tool for."""
    return f"Unknown tool {quoted(name)}: no such tool is offered. Nothing was done."


# ---------------------------------------------------------------------- delivery reasons (stable)

REASON_NO_LINK: Final = "server-unavailable"
REASON_NOT_PERMITTED: Final = "not-permitted"
REASON_NOT_REGISTERED: Final = "channel-not-registered"
REASON_SERVER_REFUSED: Final = "server-refused"
REASON_NOT_DELIVERED: Final = "not-delivered"
REASON_TIMEOUT: Final = "timeout"
REASON_NO_RECEIPT: Final = "no-receipt"
REASON_MALFORMED_RECEIPT: Final = "malformed-receipt"


def tool_not_permitted(name: str) -> str:
    """A tool the agent's allowed tools don't include, called anyway."""
    return f"{name} is not among the tools you may use here. Nothing was done."
