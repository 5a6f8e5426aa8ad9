"""Make a running fixture server say something, from a shell: a person trying the daemon (the
demo, ``config/fixtures.toml``) needs a message to arrive before a host has anything to answer.

    python3 -m mcpl_router.testing.drive CONTROL_FILE message CHANNEL TEXT [--ambient]
    python3 -m mcpl_router.testing.drive CONTROL_FILE push TEXT

``CONTROL_FILE`` is the fixture's ``--control-file`` (``config/run/b.control.json`` under
``config/fixtures.toml``; the demo prints its own). ``message`` sends ``channels/incoming`` on
the fixture's ``CHANNEL``, tagged ``chat:mention`` so an agent with the default wake rules wakes
(``--ambient``: no tags, so only an agent in the channel that takes ambient traffic does);
``push`` sends a ``push/event``. Prints what the daemon answered; exits 1 when it refused or no
fixture answers behind the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from mcpl_router.jsonrpc import RpcError
from mcpl_router.testing.control import FixtureControl, FixtureStartError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m mcpl_router.testing.drive",
        description="Make a running fixture MCPL server send a message or a push event to the daemon.",
    )
    parser.add_argument("control_file", help="the fixture's --control-file (e.g. config/run/b.control.json)")
    actions = parser.add_subparsers(dest="action", required=True)
    message = actions.add_parser("message", help="a chat message on one of the fixture's channels")
    message.add_argument("channel", help="the channel id, as the fixture registered it (e.g. general)")
    message.add_argument("text")
    message.add_argument("--ambient", action="store_true", help="no chat:mention tag: wakes only agents that take ambient traffic")
    message.add_argument("--author", default="you", help="the author's name (default: you)")
    push = actions.add_parser("push", help="a push/event (a wake without a channel)")
    push.add_argument("text")
    return parser


async def drive(args: argparse.Namespace) -> Any:
    """Send what ``args`` ask for; the daemon's answer."""
    async with FixtureControl.connect(args.control_file, timeout=5) as fixture:
        if args.action == "push":
            return await fixture.push(payload={"text": args.text}, tags=["push"])
        tags = [] if args.ambient else ["chat:mention"]
        message = {"channelId": args.channel, "text": args.text, "tags": tags, "author": {"id": args.author, "name": args.author}}
        return await fixture.incoming([message])


def _refused(answer: Any) -> bool:
    rows = answer.get("results") if isinstance(answer, dict) else None
    if isinstance(rows, list):
        return not all(isinstance(row, dict) and row.get("accepted") for row in rows)
    return isinstance(answer, dict) and answer.get("accepted") is False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        answer = trio.run(drive, args)
    except FixtureStartError as exc:
        print(f"drive: {exc} (is the daemon running with that fixture?)", file=sys.stderr)
        return 1
    except RpcError as exc:
        # -32000: the fixture has no daemon connected; any other: the daemon's own refusal.
        print(f"drive: refused ({exc.code}): {exc.message}", file=sys.stderr)
        return 1
    print(f"daemon answered: {json.dumps(answer)}")
    return 1 if _refused(answer) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
