"""Server-initiated inference (MCPL §11, §12): servers ask, the host serving the agent answers.

:class:`InferenceBroker` (``broker.py``) forwards a server's ``inference/request``/``model/info``
to the host that declared it serves the configured agent (``serving.py``), within the server's
budget (``budget.py``), and refuses with the errors of ``refusals.py``.
"""

from __future__ import annotations

from mcpl_router.inference.broker import INFERENCE_METHODS, ChunkParams, InferenceBroker, chunk_lane
from mcpl_router.inference.serving import INFERENCE, KINDS, MODEL_INFO, Serving

__all__ = ["INFERENCE", "INFERENCE_METHODS", "KINDS", "MODEL_INFO", "ChunkParams", "InferenceBroker", "Serving", "chunk_lane"]
