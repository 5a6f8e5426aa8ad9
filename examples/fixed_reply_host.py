"""A host that answers every wake with one fixed reply, using the typed client (docs/client.md).

    python examples/fixed_reply_host.py [--socket PATH] [--agent NAME] [--reply TEXT] [--count N]

It claims the agent, and for each wake opens a turn on it, writes the reply as the turn's plain
text (the daemon posts it where the wake came from), closes the turn and acks the wake.
"""

from __future__ import annotations

import argparse

import trio

from mcpl_router.client import RouterClient


async def main(socket: str | None, agent: str, reply: str, count: int) -> None:
    connect = RouterClient.connect_unix(socket) if socket else RouterClient.connect_default()
    async with connect as client:
        await client.hello("fixed-reply-host", [agent])
        print(f"serving {agent}", flush=True)
        answered = 0
        async for wake in client.wakes():
            async with client.turn(wake.agent, wakes=[wake.seq]) as turn:  # closes "completed"
                await turn.text(reply)
            await client.ack([wake.seq])
            print(f"wake {wake.seq}: {turn.receipt.text if turn.receipt else ''}", flush=True)
            answered += 1
            if answered == count:
                return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="the daemon's host socket (default: its default path)")
    parser.add_argument("--agent", default="fixed-reply")
    parser.add_argument("--reply", default="Thanks, message received.")
    parser.add_argument("--count", type=int, default=0, help="stop after N wakes (0: run until the daemon goes)")
    args = parser.parse_args()
    trio.run(main, args.socket, args.agent, args.reply, args.count)
