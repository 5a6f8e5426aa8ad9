"""mcpl-router: one daemon holding MCPL connections to many servers, routing agent hosts' turns.

The public surface is small: :class:`ChannelRef` (how every part of the daemon holds a channel)
and the version. Everything else is reached through the CLI, the host socket, or the client.
"""

from mcpl_router.routing.refs import ChannelRef

__version__ = "0.1.0"

__all__ = ["ChannelRef", "__version__"]
