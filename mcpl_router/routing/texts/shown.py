"""How a channel is written in any text: quoted ids, the id-and-server form of a channel no name
picks alone, routes, candidate lines; and the default "what was not done" phrase.
"""

from __future__ import annotations

import json
from typing import Final

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
