"""The ``mcpl-router`` command: one subcommand per job, each in :data:`COMMANDS`.

``run`` and ``demo`` run a daemon; ``check-config`` reads a file; the rest ask a running daemon
(mcpl_router/query.py). Every command that reads a config takes ``--config FILE``
(``check-config`` also takes the file as its argument).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NamedTuple

import trio

from mcpl_router import __version__
from mcpl_router.config.model import LOG_LEVELS
from mcpl_router.exit_codes import EXIT_CODES_TEXT, EXIT_CONFIG, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, UsageError, fail

#: Re-exported: the exit codes are the command's (docs/operations.md).
__all__ = ["COMMANDS", "EXIT_CONFIG", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNREACHABLE", "main"]


class Command(NamedTuple):
    """One subcommand: its name, the line the top-level help lists, what its own ``--help``
    says it does, the arguments it takes and what runs it (returning the exit code)."""

    name: str
    summary: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


def add_config_args(sub: argparse.ArgumentParser, *, positional: bool = False, text: str) -> None:
    """``--config FILE`` (and, with ``positional``, the file as the first argument too): the one
    way every command is given a config file."""
    if positional:
        sub.add_argument("file", nargs="?", metavar="FILE", help=f"{text} (or give it as --config FILE)")
    sub.add_argument("--config", metavar="FILE", default=None, help=text)


def config_file(args: argparse.Namespace, *, required: bool) -> str | None:
    """The config file the command line gave, as a positional ``FILE`` or ``--config``.

    Raises:
        UsageError: both given and different, or neither where one is required.
    """
    positional: str | None = getattr(args, "file", None)
    given: str | None = args.config
    if positional is not None and given is not None and positional != given:
        raise UsageError(f"two config files given ({positional} and --config {given}): give one.")
    chosen = positional if positional is not None else given
    if chosen is None and required:
        raise UsageError(f"{args.command} needs a config file: mcpl-router {args.command} --config FILE.")
    return chosen


def _log_level_arg(sub: argparse.ArgumentParser, default: str | None, text: str) -> None:
    sub.add_argument("--log-level", choices=LOG_LEVELS, default=default, help=text)


def _run_args(sub: argparse.ArgumentParser) -> None:
    add_config_args(sub, text="the TOML or JSON config (an mcpl-servers.json works as it is)")
    _log_level_arg(sub, None, "the lowest level logged, instead of the config's logging.level")


def _demo_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--once", action="store_true", help="print the overview and the scripted turn, then exit")
    _log_level_arg(sub, "error", "show the daemon's log lines at this level and above (default: error)")


def _check_args(sub: argparse.ArgumentParser) -> None:
    add_config_args(sub, positional=True, text="the TOML or JSON config to check")


def _query_args(sub: argparse.ArgumentParser) -> None:
    add_config_args(
        sub, text="find the daemon from this config (reads only host.*, journal.*, health.*: no secrets needed)"
    )
    sub.add_argument("--socket", metavar="PATH", default=None, help="the daemon's host Unix socket (host.unixSocket)")
    sub.add_argument(
        "--url", default=None, help="http://HOST:PORT of its [health] listener (health only), or ws://… of its host WebSocket"
    )
    sub.add_argument("--token-file", metavar="PATH", default=None, help="with a ws:// --url: the file holding the host token (default host.tokenFile)")
    sub.add_argument("--json", action="store_true", help="print the raw JSON answer")


def _explain_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("name", help="a channel name as an agent or a host would give it: an id, server:id, a DM's label")
    sub.add_argument("--server", default=None, help="a serverId given beside the name (the exact pair is then matched)")
    _query_args(sub)


def _check_config(args: argparse.Namespace) -> int:
    from mcpl_router.config import check_config

    file = config_file(args, required=True)
    assert file is not None
    ok, text = check_config(file)
    print(text, file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_CONFIG


def _demo(args: argparse.Namespace) -> int:
    from mcpl_router.demo import run_demo
    from mcpl_router.logs import configure_logging

    configure_logging(args.log_level, json=False)
    return trio.run(lambda: run_demo(once=args.once))


def _query(args: argparse.Namespace) -> int:
    from mcpl_router.query import query

    return query(args)


def _journal_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "action", choices=["check", "copy"],
        help="check: the checks a start makes, and what the journal holds; copy: move a whole journal into an empty one",
    )
    add_config_args(sub, text="the config file whose journal.path to check")
    sub.add_argument("--journal", metavar="PATH", help="the journal file to check (instead of a config's journal.path)")
    sub.add_argument("--from", dest="source", metavar="SPEC", help="copy: the journal copied, sqlite:PATH or postgres:DSN")
    sub.add_argument("--to", dest="target", metavar="SPEC", help="copy: the empty journal it goes to, sqlite:PATH or postgres:DSN")


def _journal(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mcpl_router.store.integrity import inspect_journal
    from mcpl_router.store.journal import JournalRefused

    if args.action == "copy":
        return _journal_copy(args)
    if args.journal:
        path = Path(args.journal)
    else:
        from mcpl_router.config import ConfigError, load_config

        try:
            given = config_file(args, required=True)
            assert given is not None  # required
            config = load_config(given)
        except ConfigError as exc:
            return fail(str(exc), EXIT_CONFIG)
        path = Path(config.journal.path)
        if config.journal.backend == "postgres" and config.journal.dsn is not None:
            from mcpl_router.store.postgres_backend import inspect_postgres

            try:
                password = None if config.journal.password_file is None else config.journal.password_file.read_text().strip()
                print("\n".join(inspect_postgres(config.journal.dsn, password=password)))
            except (JournalRefused, OSError) as exc:
                print(f"mcpl-router: {exc}")
                return EXIT_REFUSED
            return EXIT_OK
    try:
        lines = inspect_journal(path)
    except JournalRefused as exc:
        print(f"mcpl-router: {exc}")
        return EXIT_REFUSED
    print("\n".join(lines))
    return EXIT_OK


def _journal_copy(args: argparse.Namespace) -> int:
    from mcpl_router.logs import configure_logging
    from mcpl_router.store.copy import copy_journal
    from mcpl_router.store.journal import JournalLocked, JournalRefused

    if not args.source or not args.target:
        return fail("journal copy needs --from SPEC and --to SPEC (sqlite:PATH or postgres:DSN).", EXIT_CONFIG)
    configure_logging("warning", json=False)
    try:
        report = copy_journal(args.source, args.target)
    except (JournalRefused, JournalLocked) as exc:
        print(f"mcpl-router: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print("\n".join(report.lines()))
    return EXIT_OK


COMMANDS: tuple[Command, ...] = (
    Command(
        "run", "run the daemon with a config file",
        "Run the daemon: connect every enabled server in the config, listen for hosts, and serve "
        "until SIGTERM or SIGINT (a graceful drain); SIGHUP re-reads the file. It first makes the "
        "checks check-config makes: what it refuses, it says in one line and exits 2.",
        _run_args, lambda args: _run(args),
    ),
    Command(
        "demo", "two bundled servers sharing a channel id; no external service",
        "Start the daemon with two bundled fixture servers that both register a channel called "
        "general, show how names resolve, run one scripted host turn, and keep running until "
        "Ctrl-C (with --once: exit). It uses its own embedded config and a temporary directory.",
        _demo_args, _demo,
    ),
    Command(
        "check-config", "validate a config file and say what it configures",
        "Read a config file and say what it configures, or every problem in it (file, key, "
        "problem, fix), with the checks run makes before it starts: the socket directory, the "
        "journal directory, the token file, each server's command, cwd and ./ arguments. Exit 0 "
        "when run would start with it, 2 otherwise.",
        _check_args, _check_config,
    ),
    Command(
        "status", "the daemon's servers (and why one isn't ready), agents and the last reload",
        "Ask the running daemon for its state: each server's link (and why one isn't ready), "
        "the agents and their hosts, the last reload.",
        _query_args, _query,
    ),
    Command(
        "channels", "every registered channel",
        "List every channel the daemon's servers have registered: the name it is shown by, its "
        "server and id, and whether it is open.",
        _query_args, _query,
    ),
    Command(
        "reload", "re-read the daemon's config file now (as SIGHUP does) and say what changed",
        "Make the running daemon re-read its config file now (as SIGHUP does) and say what it "
        "applied, or why it refused the new file (the old config keeps running; exit 3).",
        _query_args, _query,
    ),
    Command(
        "health", "exit 0 when the daemon is ready; the container health check",
        "Exit 0 when the daemon is ready, 3 when it answers not ready (saying why), 1 when "
        "nothing answers. Asks its [health] listener's /readyz when the config has one, else its "
        "host socket.",
        _query_args, _query,
    ),
    Command(
        "journal", "check the journal file (journal check), or move a journal to another backend (journal copy)",
        "journal check: run the checks a start makes on the journal file (is it an SQLite "
        "database, does SQLite's quick_check pass, is its schema one this version knows, is it "
        "there when its marker says it held messages) without starting a daemon, and say what it "
        "holds. Read-only: a running daemon's journal can be checked. Exit 0 when a start would "
        "take it, 3 when it would refuse it (the line says what to do). docs/operations.md, When "
        "the journal is damaged, is the recovery path. journal copy --from sqlite:PATH --to "
        "postgres:DSN: move a whole journal (unacked wakes, drafts, tune-outs, channel decisions…) "
        "into an empty one, refusing a target that holds anything or a journal a daemon runs on.",
        _journal_args, _journal,
    ),
    Command(
        "explain", "how a channel name resolves, and why (exit 3 when it picks none)",
        "Say which channel a name picks in the running daemon and by which rule, or why it picks "
        "none (exit 3), with every channel that answers to it.",
        _explain_args, _query,
    ),
)


def _parser() -> argparse.ArgumentParser:
    width = max(len(command.name) for command in COMMANDS) + 2
    listing = "\n".join(f"  {command.name:<{width}}{command.summary}" for command in COMMANDS)
    parser = argparse.ArgumentParser(
        prog="mcpl-router",
        usage="mcpl-router [-h] [--version] COMMAND ...",
        description="Route MCPL servers' channels to agent hosts.",
        epilog=f"commands:\n{listing}\n\n'mcpl-router COMMAND --help' says what each does.\n\n{EXIT_CODES_TEXT}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mcpl-router {__version__}")
    # The commands are listed once, in the epilog above: no {a,b,…} set in the usage line.
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name, description=command.help, epilog=EXIT_CODES_TEXT, help=command.summary
        )
        command.add_arguments(sub)
        sub.set_defaults(handler=command.handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except UsageError as exc:
        return fail(str(exc), EXIT_CONFIG)
    except KeyboardInterrupt:
        return 130


#: The cyclic collector's thresholds while the daemon serves (Python's default: 700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Keep the cyclic collector off the message path.

    A message's objects (its task, events, wake, answer) live for a few commits; with the
    default thresholds they survive into the older generations, which are collected every few
    hundred messages (2 ms each) and, now and then, whole (60 ms with a server's worth of
    channels loaded): the latency's tail. Everything built before the daemon runs (modules,
    the parsed config) is frozen out of the collector's scans — what ``Daemon.run`` loads
    later (the journal's state, the registry) is not — and the young generation is collected
    less often, so what a message leaves behind dies young.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _run(args: argparse.Namespace) -> int:
    from mcpl_router.config import ConfigError, load_config
    from mcpl_router.daemon import Daemon
    from mcpl_router.logs import configure_logging

    file = config_file(args, required=True)
    assert file is not None
    try:
        config = load_config(file)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    fmt = config.logging.format
    configure_logging(args.log_level or config.logging.level, json=None if fmt == "auto" else fmt == "json")
    from mcpl_router.config import preflight
    from mcpl_router.logs import get_logger

    # The checks check-config makes (config/preflight.py): a refusal before anything is made,
    # listens or dials; a problem said once, up front, with the key and the fix, but not fatal
    # (a program may be installed, a directory mounted, later; the link retries).
    checks = preflight(config)
    if checks.refusals:
        for line in checks.refusals:
            print(f"mcpl-router: not started: {line}", file=sys.stderr)
        return EXIT_CONFIG
    for problem in checks.problems:
        get_logger().warning("config.runtime_problem", key=problem.key, problem=problem.problem, fix=problem.fix)
    try:
        if config.cluster is not None:
            from mcpl_router.cluster import ClusterNode

            # A node: a standby until it holds the links' lease, then a daemon (docs/cluster.md).
            daemon: Daemon | ClusterNode = ClusterNode(config)
        else:
            daemon = Daemon(config)
        tune_gc()
        from mcpl_router.supervision import run_until_signalled

        trio.run(run_until_signalled, daemon)
    except BaseException as exc:
        refusal = _startup_refusal(exc)
        if refusal is None:
            raise
        print(f"mcpl-router: not started: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK


def _startup_refusal(exc: BaseException) -> BaseException | None:
    """A refusal to start (unsafe socket directory, token problems, a port in use), found even
    inside a group."""
    from mcpl_router.errors import StartupRefusal, first_leaf
    from mcpl_router.hosts.auth import HostAuthError
    from mcpl_router.hosts.listener import SocketSetupError
    from mcpl_router.store.journal import JournalLocked, JournalRefused

    return first_leaf(
        exc, lambda leaf: isinstance(leaf, (SocketSetupError, HostAuthError, StartupRefusal, JournalLocked, JournalRefused))
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

