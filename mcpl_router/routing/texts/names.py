"""The one resolver's refusals: a name that picks no single channel, said with every candidate.
Read by an agent (its tools), a host (``channels/publish``) and an operator (``explain``); the
``lister`` each is pointed to is theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mcpl_router.routing.texts.shown import quoted, route_for

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


#: What lists the channels, named in a refusal: the agent's tool, or (in ``explain``, which an
#: operator reads) the operator's command.
AGENT_LISTER: Final = "channel_list"
OPERATOR_LISTER: Final = "`mcpl-router channels`"


def unknown_name(name: str, shown: Sequence[str], more: int, not_done: str, lister: str = AGENT_LISTER) -> str:
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
        f" {lister} lists every channel with its server."
    )


def no_qualified_pair(name: str, id_on: Sequence[str], not_done: str) -> str:
    """A name read only as ``serverId:channelId`` (a gate rule's entry) that no pair has.

    ``id_on``: the servers with a channel whose id is ``name``, which that reading never takes.
    """
    text = f"No channel's serverId:channelId is {quoted(name)}. {not_done}"
    if id_on:
        servers = ", ".join(quoted(server_id) for server_id in id_on)
        where = f"server {servers}" if len(id_on) == 1 else f"servers {servers}"
        first = id_on[0]
        text += (
            f" {quoted(name)} is the id of a channel on {where}, not a qualified name:"
            f" write it with its server, e.g. {quoted(f'{first}:{name}')}."
        )
    return text


def not_on_server(
    name: str, server_id: str, places: Sequence[str], not_done: str, lister: str = AGENT_LISTER
) -> str:
    """A ``serverId`` given with an id that server doesn't have.

    ``places`` describe each server that has the id (see :func:`place_by_name` and
    :func:`place_by_route`).
    """
    head = f"Server {quoted(server_id)} has no channel {quoted(name)}. {not_done}"
    if not places:
        return (
            f"{head} No server has a channel {quoted(name)}."
            f" {lister} lists every channel with its server."
        )
    if len(places) == 1:
        return f"{head} A channel {quoted(name)} is on {places[0]}."
    return f"{head} A channel {quoted(name)} is on " + ", ".join(places[:-1]) + f" and {places[-1]}."


def place_by_name(server_id: str, name: str, *, advise: bool = True) -> str:
    """Where a channel is, with the name that picks it alone.

    ``advise``: say to name it so. Not for a call whose schema has no ``serverId`` (channel_publish)
    or that gave an exact ref: the channel it asked for is not there, and the one named here is
    another destination, perhaps another community's, so it is told where the id is, not to go.
    """
    if advise:
        return f"server {quoted(server_id)} (name it {name})"
    return f"server {quoted(server_id)} ({name})"


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


def no_name(not_done: str, lister: str = AGENT_LISTER) -> str:
    """A call that named no channel where one was needed."""
    return f"No channel was named. {not_done} Give a channel's name as channelId; {lister} lists them."
