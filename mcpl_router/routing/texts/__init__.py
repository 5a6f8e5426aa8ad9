"""Every text the daemon gives an agent, a host, a server or an operator, in one voice, in one
module per audience: ``agent``, ``host``, ``server``, ``operator``; ``names`` (the resolver's
refusals, read by all three), ``shown`` (how a channel is written) and ``reasons`` (the
stable machine strings). Every name is read here as ``texts.X``.

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

from mcpl_router.routing.texts.shown import *  # noqa: F403
from mcpl_router.routing.texts.reasons import *  # noqa: F403
from mcpl_router.routing.texts.names import *  # noqa: F403
from mcpl_router.routing.texts.operator import *  # noqa: F403
from mcpl_router.routing.texts.server import *  # noqa: F403
from mcpl_router.routing.texts.host import *  # noqa: F403
from mcpl_router.routing.texts.agent import *  # noqa: F403

