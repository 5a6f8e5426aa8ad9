"""Finding the error that matters inside trio's exception groups."""

from __future__ import annotations

from collections.abc import Callable, Iterator


def leaf_exceptions(exc: BaseException) -> Iterator[BaseException]:
    """Every exception that isn't a group, depth first (``exc`` itself if it isn't one)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaf_exceptions(inner)
    else:
        yield exc


def first_leaf(exc: BaseException, matches: Callable[[BaseException], bool]) -> BaseException | None:
    """The first leaf of ``exc`` that ``matches``, or None."""
    return next((leaf for leaf in leaf_exceptions(exc) if matches(leaf)), None)


class StartupRefusal(Exception):
    """The daemon can't start as configured; ``str()`` is one line: file, key, problem, fix."""

    def __init__(self, source: str, key: str, problem: str, fix: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"{source}: {key}: {problem} {fix}")


def listen_refusal(source: str, key: str, bind: str, port: int, exc: OSError) -> StartupRefusal:
    """A listener that could not bind, said as a config problem (the key that chose the port)."""
    import errno

    where = f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return StartupRefusal(
            source, key, f"{where} is already in use.",
            "Stop whatever listens there (another mcpl-router?), or choose another port (0 lets the OS pick).",
        )
    if exc.errno == errno.EACCES:
        return StartupRefusal(source, key, f"{where}: permission denied.", "Choose a port above 1023, or run with the privilege to bind it.")
    if exc.errno == errno.EADDRNOTAVAIL:
        bind_key = key.rsplit(".", 1)[0] + ".bind"
        return StartupRefusal(source, bind_key, f"{bind!r} is not an address of this machine.", 'Bind "127.0.0.1", or an address this machine has.')
    return StartupRefusal(source, key, f"can't listen on {where}: {exc.strerror or exc}.", "Check the address and port.")


def bind_failure(exc: BaseException) -> OSError | None:
    """The OSError a listener's bind raised, found even inside a group."""
    leaf = first_leaf(exc, lambda leaf: isinstance(leaf, OSError) and leaf.errno is not None)
    return leaf if isinstance(leaf, OSError) else None
