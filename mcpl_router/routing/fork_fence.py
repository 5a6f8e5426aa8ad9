"""A conversation fork's channel fence: which channel a fork's channel tool call may act on.

A fork acts only on its home (a :class:`~mcpl_router.routing.refs.ChannelRef`), so its channel
tools read a name against the home first (seed 000, #612 and #714):

- a name its home answers to (its id, its qualified ``serverId:channelId``, the name it is shown
  by, a DM's label) means its home, on the home's server;
- a ``serverId`` beside a ``channelId`` names that exact pair, so beside one only the home's own
  id names the home; the home's qualified name with the home's serverId is told the name works
  alone (that pair names no channel), unless the home's server registers a channel whose id *is*
  that name, which is then the pair asked for, and not the home;
- a ``serverId`` alone has to be the home's (a publish's; with no name at all, the home);
- a home its server no longer registers is refused as such, with nothing posted or closed;
- a fork opens no channel, and declines none but its home.

The fork's speech (``>>`` targets) is outside this fence. Pure: the shell passes what the
registry says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs

from mcpl_router.routing import texts
from mcpl_router.routing.refs import ChannelRef

#: Stable reasons of a fork's refusals (docs/errors.md).
REASON_FORK_NOT_HOME: Final = "fork-not-home"
REASON_FORK_HOME_GONE: Final = "fork-home-gone"
REASON_FORK_NO_OPEN: Final = "fork-cannot-open"
REASON_FORK_NAME_ALONE: Final = "fork-name-works-alone"

OPEN: Final = "open"


@attrs.frozen
class FenceRefusal:
    reason: str
    text: str
    #: What the call asked for, as given (for the result's data).
    asked: dict[str, str | None]


def fenced(
    verb: str,
    home: ChannelRef,
    name: str | None,
    server_id: str | None,
    *,
    is_registered: Callable[[ChannelRef], bool],
    home_names: frozenset[str],
    home_shown: str,
    not_done: str,
) -> ChannelRef | FenceRefusal:
    """The channel a fork's ``verb`` call (``open``, ``close``, ``decline``, ``publish``) may
    act on (its home), or why not. ``home_names``: every name the home answers to (besides
    its qualified name). An empty ``name``/``server_id`` is none given."""
    asked = {"channelId": name or None, "serverId": server_id or None}
    name, server_id = name or None, server_id or None
    if verb == OPEN:
        return FenceRefusal(REASON_FORK_NO_OPEN, texts.fork_cannot_open(home_shown, _asked_text(name, server_id)), asked)
    target = _target(home, name, server_id, home_names)
    if isinstance(target, str):
        if target == REASON_FORK_NAME_ALONE:
            pair = ChannelRef(home.server_id, home.qualified_name)
            if is_registered(pair):
                # The home's server has a channel whose id is the home's qualified name: that pair is it.
                text = texts.fork_not_home(verb, home_shown, _asked_text(name, server_id), not_done)
                return FenceRefusal(REASON_FORK_NOT_HOME, text, asked)
            return FenceRefusal(REASON_FORK_NAME_ALONE, texts.fork_name_works_alone(verb, home_shown, home.server_id, not_done), asked)
        return FenceRefusal(REASON_FORK_NOT_HOME, texts.fork_not_home(verb, home_shown, _asked_text(name, server_id), not_done), asked)
    if not is_registered(home):
        return FenceRefusal(REASON_FORK_HOME_GONE, texts.fork_home_gone(verb, home_shown, home.server_id), asked)
    return home


def _target(home: ChannelRef, name: str | None, server_id: str | None, home_names: frozenset[str]) -> ChannelRef | str:
    if name is None:
        if server_id is None or server_id == home.server_id:
            return home
        return REASON_FORK_NOT_HOME
    if server_id is not None:
        if server_id == home.server_id and name == home.channel_id:
            return home
        if server_id == home.server_id and name == home.qualified_name:
            return REASON_FORK_NAME_ALONE
        return REASON_FORK_NOT_HOME
    if name == home.channel_id or name == home.qualified_name or name in home_names:
        return home
    return REASON_FORK_NOT_HOME


def _asked_text(name: str | None, server_id: str | None) -> str:
    if name is None:
        return f"server {texts.quoted(server_id or '')}"
    if server_id is None:
        return texts.quoted(name)
    return f"{texts.quoted(name)} on server {texts.quoted(server_id)}"
