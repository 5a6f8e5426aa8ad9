"""The routing core: pure decisions over refs, names, turns and channels.

Nothing in this package imports ``mcpl_router.mcpl``, ``mcpl_router.hosts`` or
``mcpl_router.store``; ``tests/unit/test_layering.py`` fails if it does.
"""
