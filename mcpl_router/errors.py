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
