"""What ``/metrics`` shows: counters the daemon keeps, and its state read at scrape time.

Two kinds of series, in one per-daemon :class:`prometheus_client.CollectorRegistry`:

- **counted as it happens** (:class:`DaemonMetrics`' counters and histograms): inbound messages
  and registrations answered, wakes sent and acked, ``beforeInference`` latency and outcomes,
  journal commits, backpressure events, reloads; the two counted per message (inbound messages,
  wakes sent) as plain integers, turned into series at each scrape;
- **read when scraped** (:class:`_StateCollector`): each link's state, epochs and channels,
  publishes by outcome, peer queue depths, pending wakes, resolution refusals by kind, typing
  indicators, open turns. Reading the parts' own ``status()``/``statistics()`` at scrape time
  keeps the hot paths free of metric calls and cannot drift from what ``status`` says.

Every series of the daemon's own is prefixed ``mcpl_router_``; beside them, the process and
platform series every Python exporter has (``process_*``, ``python_*``). ``docs/operations.md``
lists them. No ``_created`` series: they double a scrape for a start time ``process_start_time_seconds``
already gives. A scraper that asks for OpenMetrics (its ``Accept`` header) gets it.
"""

from __future__ import annotations

import collections
import platform
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeVar, cast

import attrs
from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from mcpl_router import __version__
from mcpl_router.events import EventBus, RegistrationsAnswered
from mcpl_router.inference.ports import ChunkOutcome, InferenceOutcome
from mcpl_router.inference.refusals import ChunkDrop, InferenceRefusal
from mcpl_router.store.records import COMMIT_SECONDS_BUCKETS

if TYPE_CHECKING:
    from mcpl_router.health import Readiness
    from mcpl_router.jsonrpc.peer import PeerStatistics
    from mcpl_router.hosts.admission import HostAdmission
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.sessions import SessionManager
    from mcpl_router.mcpl.link import ServerLink
    from mcpl_router.mcpl.liveness import Liveness
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal, JournalStatistics
    from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
    from mcpl_router.tools.table import NameClash
    from mcpl_router.turns import TurnManager

#: A counter or a histogram: a labelled series is of its metric's type.
_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LINK_STATES = ("connecting", "ready", "retrying", "closed", "failed")
_LIVENESS_STATES = ("answering", "unresponsive", "unknown", "not-checked")

#: Agents labelled by name; past this many, host-declared agents share :data:`OTHER_AGENTS`.
MAX_AGENT_LABELS: Final = 200
OTHER_AGENTS: Final = "other"


class DaemonMetrics:
    """The daemon's metrics registry; the shell calls the ``*_`` recording methods."""

    def __init__(self, configured_agents: Collection[str], *, events: EventBus | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        # What every Python exporter shows: memory, CPU, descriptors, start time; the
        # interpreter; the collector's passes.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        Info("mcpl_router_build", "The daemon's version and the Python that runs it.", registry=registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        # Counted once or twice per message: plain tallies, read into their series at each scrape
        # (a prometheus_client child's ``inc`` takes a lock and checks its amount every time).
        self.inbound = _Tally(
            "mcpl_router_inbound_messages",
            "Messages and pushes servers sent, by how they were answered (code: the refusal's JSON-RPC code).",
            ("server", "outcome", "code"),
        )
        self.registrations = Counter(
            "mcpl_router_channel_registrations",
            "Channel descriptors servers registered or updated, accepted or refused (by reason).",
            ["server", "outcome", "reason"],
            registry=registry,
        )
        self.wakes_sent = _Tally("mcpl_router_wakes_sent", "Wake notifications sent to hosts (re-sends included).", ("agent",))
        registry.register(_Tallies((self.inbound, self.wakes_sent)))
        self.wakes_acked = Counter("mcpl_router_wakes_acked", "Wakes hosts acknowledged (wake/ack).", ["agent"], registry=registry)
        self.wake_gate = Counter(
            "mcpl_router_wake_gate",
            "Wake gate outcomes (held, batches, dropped at delivery, unowned) by agent.",
            ["agent", "outcome"],
            registry=registry,
        )
        self.context_seconds = Histogram(
            "mcpl_router_before_inference_seconds",
            "How long each server took to answer context/beforeInference.",
            ["server"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.context_outcomes = Counter(
            "mcpl_router_before_inference",
            "Requests for context/beforeInference sent to servers, by outcome (ok, timeout, error).",
            ["server", "outcome"],
            registry=registry,
        )
        self.reloads = Counter("mcpl_router_config_reloads", "Config reloads (SIGHUP, mcpl-router reload) by outcome.", ["outcome"], registry=registry)
        self.tool_name_clashes = Counter(
            "mcpl_router_tool_name_clashes",
            "Tool names refused when the name table was built (kind: daemon-tool, servers), each clash once as it appeared.",
            ["kind"],
            registry=registry,
        )
        self.inference_requests = Counter(
            "mcpl_router_inference_requests",
            "Servers' inference/request and model/info forwarded to hosts, by outcome: answered, or the refusal's reason.",
            ["server", "method", "outcome"],
            registry=registry,
        )
        self.inference_chunks = Counter(
            "mcpl_router_inference_chunks",
            "Hosts' inference/chunk notifications: forwarded to the asking server, or dropped (by reason).",
            ["outcome"],
            registry=registry,
        )
        self._configured_agents = configured_agents
        self._labelled_agents: set[str] = set()
        # The labelled series counted per message, looked up here rather than through
        # ``labels()`` (a lock and a tuple of strings each time). As bounded as the series.
        self._series: dict[tuple[int | str, ...], MetricWrapperBase] = {}
        if events is not None:
            events.subscribe(RegistrationsAnswered, self.registrations_answered)

    def render(self) -> bytes:
        """The exposition text (Prometheus format 0.0.4)."""
        return self.exposition(None)[0]

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The page and its Content-Type for a scraper that sent ``accept``: OpenMetrics when
        it asks for it, the Prometheus text format otherwise."""
        encode, content_type = choose_encoder(accept or "")
        return encode(_WithoutCreated(self.registry)), content_type

    # -- recording (called by the shell) ----------------------------------------------------

    def inference_outcome(self, server_id: str, method: str, outcome: InferenceOutcome) -> None:
        """One server inference request's end: ``answered`` or a refusal's value (docs/errors.md)."""
        label = outcome.value if isinstance(outcome, InferenceRefusal) else outcome
        self._series_of(self.inference_requests, server_id, method, label).inc()

    def inference_chunk(self, outcome: ChunkOutcome) -> None:
        """One host chunk: ``forwarded``, or the value of the reason it was dropped."""
        self._series_of(self.inference_chunks, outcome.value if isinstance(outcome, ChunkDrop) else outcome).inc()

    def inbound_answered(self, server_id: str, accepted: int, refused: Sequence[object] = ()) -> None:
        """What a server's ``channels/incoming`` or push got back: ``accepted`` messages, and
        the code of each one refused. Told by the handler that made the answer, which knows
        the counts, so no answer is read back to count it."""
        counts = self.inbound.counts
        if accepted:
            counts[(server_id, "accepted", "")] += accepted
        for code in refused:
            counts[(server_id, "refused", str(code))] += 1

    def registrations_answered(self, answered: RegistrationsAnswered) -> None:
        """Each descriptor of a ``channels/register``/``changed``, accepted or refused (labelled
        by the refusal's stable value, never by parsing its sentence)."""
        for result in answered.results:
            if result.accepted:
                self.registrations.labels(answered.server_id, "accepted", "").inc()
            else:
                label = result.refusal.value if result.refusal is not None else "other"
                self.registrations.labels(answered.server_id, "refused", label).inc()

    def context_answered(self, outcomes: Mapping[str, str], elapsed: Mapping[str, float]) -> None:
        """One ``beforeInference`` fan-out's per-server outcomes and latencies."""
        for server_id, outcome in outcomes.items():
            if outcome == "skipped":
                continue
            self._series_of(self.context_outcomes, server_id, outcome).inc()
            if server_id in elapsed:
                self._series_of(self.context_seconds, server_id).observe(elapsed[server_id])

    def agent_label(self, agent: str) -> str:
        """The ``agent`` label for ``agent``: its name for the first :data:`MAX_AGENT_LABELS`
        agents seen (configured ones always), :data:`OTHER_AGENTS` for the rest, so hosts
        declaring new agent names can't grow the series without end."""
        if agent in self._labelled_agents:
            return agent
        configured = agent in self._configured_agents
        if configured or len(self._labelled_agents) < MAX_AGENT_LABELS:
            self._labelled_agents.add(agent)
            return agent
        return OTHER_AGENTS

    def tool_name_clash(self, clash: NameClash) -> None:
        """A server tool's offered name clashed (the name table refused it)."""
        self.tool_name_clashes.labels(clash.kind).inc()

    def wake_gated(self, agent: str, outcome: str) -> None:
        """A wake gate held a wake, sent a batch, dropped a held wake or found no owner."""
        self._series_of(self.wake_gate, self.agent_label(agent), outcome).inc()

    def wake_sent(self, agent: str) -> None:
        self.wakes_sent.counts[(self.agent_label(agent),)] += 1

    def _series_of(self, metric: _Metric, *labels: str) -> _Metric:
        """``metric.labels(*labels)``, looked up once per label set: ``labels()`` takes a lock
        and checks its arguments on every call, and the hot paths record per message and per
        turn. As bounded as the labels are (server ids, outcomes, capped agent labels)."""
        key: tuple[int | str, ...] = (id(metric), *labels)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = metric.labels(*labels)
        # Keyed by the metric's identity: the series is a child of that very metric, its type.
        return cast(_Metric, series)

    def wakes_acknowledged(self, agents: Sequence[str], count: int) -> None:
        # An ack names seqs, not agents: with several agents the count goes to "*".
        if count and agents:
            self.wakes_acked.labels(self.agent_label(agents[0]) if len(agents) == 1 else "*").inc(count)


class _Tally:
    """A counter family counted as plain integers by label values (no lock: the trio thread
    is the only writer) and read into a :class:`CounterMetricFamily` at each scrape."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.counts: collections.Counter[tuple[str, ...]] = collections.Counter()

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=list(self.labels))
        for values, count in list(self.counts.items()):
            family.add_metric(list(values), count)
        return family


class _Tallies(Collector):
    """The :class:`_Tally` families as a collector of the metrics' registry."""

    def __init__(self, tallies: Sequence[_Tally]) -> None:
        self._tallies = tuple(tallies)

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(tally.name, tally.documentation, labels=list(tally.labels)) for tally in self._tallies]

    def collect(self) -> Iterator[Metric]:
        for tally in self._tallies:
            yield tally.family()


@attrs.frozen
class _WithoutCreated:
    """The registry's series without the ``_created`` samples prometheus_client adds to each
    counter and histogram (filtered per scrape, not switched off process-wide)."""

    registry: CollectorRegistry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            metric.samples = [sample for sample in metric.samples if not sample.name.endswith("_created")]
            yield metric


def without_created(registry: CollectorRegistry) -> _WithoutCreated:
    """``registry`` as a scrape shows it: no ``_created`` samples."""
    return _WithoutCreated(registry)


@attrs.frozen
class ScrapedParts:
    """The parts whose state each scrape reads (the daemon's own objects, read-only here)."""

    router: Router
    links: Mapping[str, ServerLink]
    host_connections: Collection[HostConnection]
    sessions: SessionManager
    journal: Journal
    turns: TurnManager
    readiness: Callable[[], Readiness]
    channel_decisions: ChannelLifecycle
    liveness: Liveness
    admission: HostAdmission


class StateScrape(Collector):
    """Series read from the parts' state at each scrape: built last, once the parts exist
    (they count into :class:`DaemonMetrics` from their construction), it registers itself
    with the metrics' registry."""

    def __init__(self, parts: ScrapedParts, metrics: DaemonMetrics) -> None:
        self._parts = parts
        self._metrics = metrics
        metrics.registry.register(self)

    def describe(self) -> list[Metric]:
        return []  # unchecked: the series depend on the servers configured now

    def collect(self) -> Iterator[Metric]:
        parts = self._parts
        up = GaugeMetricFamily("mcpl_router_server_up", "1 while the server's link is ready.", labels=["server"])
        state = GaugeMetricFamily("mcpl_router_server_state", "The link's state (1 for the current one).", labels=["server", "state"])
        required = GaugeMetricFamily("mcpl_router_server_required", "1 for a server marked required (readiness waits for it).", labels=["server"])
        connects = CounterMetricFamily("mcpl_router_server_connects", "Transport epochs started (first connection and every reconnect).", labels=["server"])
        reconnects = CounterMetricFamily("mcpl_router_server_reconnects", "Reconnection attempts (epochs after the first).", labels=["server"])
        channels = GaugeMetricFamily("mcpl_router_server_channels", "Channels the server has registered now.", labels=["server"])
        liveness = GaugeMetricFamily(
            "mcpl_router_server_liveness", "Whether a ready server answers ping (1 for its current liveness).", labels=["server", "state"]
        )
        missed = CounterMetricFamily("mcpl_router_server_pings_missed", "Pings a server left unanswered past their deadline.", labels=["server"])
        refused = CounterMetricFamily("mcpl_router_inbound_refused_at_admission", "Inbound methods refused by the grant (reason: not-granted, before-policy).", labels=["server", "reason"])
        publishes = CounterMetricFamily("mcpl_router_publishes", "Publishes to servers by outcome (delivered, failed, unknown) and reason.", labels=["server", "outcome", "reason"])
        depth = GaugeMetricFamily("mcpl_router_queue_depth", "Messages waiting in a bounded queue now.", labels=["queue", "owner"])
        pending = GaugeMetricFamily("mcpl_router_pending_requests", "Requests awaiting an answer now.", labels=["peer", "owner"])
        pressure = CounterMetricFamily(
            "mcpl_router_peer_backpressure_events",
            "Backpressure on a connection, this connection (kind: read-waits: its read loop waited for room;"
            " write-waits: a send waited for its outbox; stalled: closed for not reading).",
            labels=["peer", "owner", "kind"],
        )
        outbox_bytes = GaugeMetricFamily("mcpl_router_peer_outbox_bytes", "Bytes queued for a peer to read now.", labels=["peer", "owner"])
        per_server: dict[str, int] = {}
        for entry in parts.router.registry.all_entries():
            per_server[entry.ref.server_id] = per_server.get(entry.ref.server_id, 0) + 1
        for server_id, link in list(parts.links.items()):
            current = link.state.value
            up.add_metric([server_id], 1.0 if current == "ready" else 0.0)
            for name in _LINK_STATES:
                state.add_metric([server_id, name], 1.0 if name == current else 0.0)
            required.add_metric([server_id], 1.0 if link.config.required else 0.0)
            connects.add_metric([server_id], float(link.epoch))
            reconnects.add_metric([server_id], float(max(0, link.epoch - 1)))
            channels.add_metric([server_id], float(per_server.get(server_id, 0)))
            alive = parts.liveness.of(server_id)
            for name in _LIVENESS_STATES:
                liveness.add_metric([server_id, name], 1.0 if name == alive.state else 0.0)
            missed.add_metric([server_id], float(alive.missed))
            for refusal, count in link.admission_refused.items():
                refused.add_metric([server_id, refusal.value], float(count))
            for (outcome, why), count in link.session.publishes.items():
                publishes.add_metric([server_id, outcome, why.value if why is not None else ""], float(count))
            stats = link.peer_statistics()
            if stats is not None:
                _peer_series(stats, "server", server_id, depth, pending, pressure, outbox_bytes)
        connections = list(parts.host_connections)
        live: collections.Counter[str] = collections.Counter()
        for connection in connections:
            if connection.peer is not None:
                live.update({key: value for key, value in attrs.asdict(connection.peer.statistics()).items() if isinstance(value, int)})
        # Host connections summed; the counters include connections that have closed.
        hosts_total = parts.sessions.host_statistics()
        depth.add_metric(["host-inbound", "*"], float(live["inbound_queued"]))
        depth.add_metric(["host-outbox", "*"], float(live["outbox_messages"]))
        pending.add_metric(["host", "*"], float(live["pending_requests"]))
        outbox_bytes.add_metric(["host", "*"], float(live["outbox_bytes"]))
        pressure.add_metric(["host", "*", "read-waits"], float(hosts_total["backpressureWaits"]))
        pressure.add_metric(["host", "*", "write-waits"], float(live["outbox_waits"]))
        pressure.add_metric(["host", "*", "stalled"], float(hosts_total["stalledDisconnects"]))
        disconnects = CounterMetricFamily(
            "mcpl_router_host_disconnects", "Host connections the daemon closed (reason: stalled, outbox-full); their wakes stay in the journal.", labels=["reason"]
        )
        disconnects.add_metric(["stalled"], float(hosts_total["stalledDisconnects"]))
        disconnects.add_metric(["outbox-full"], float(hosts_total["outboxFullDisconnects"]))
        outboxes = parts.sessions.outbox_statistics()
        depth.add_metric(["host-wakes", "*"], float(sum(row["noticesQueued"] + row["freshQueued"] for row in outboxes)))
        in_flight = GaugeMetricFamily("mcpl_router_wakes_in_flight", "Wakes sent and not acked yet, on open connections (each connection's window).")
        in_flight.add_metric([], float(sum(row["inFlight"] for row in outboxes)))
        journal = parts.journal.statistics()
        depth.add_metric(["journal-writes", "*"], float(journal.queued_writes))
        yield from (up, state, required, connects, reconnects, channels, liveness, missed, refused, publishes, depth, pending, pressure, outbox_bytes, in_flight, disconnects)
        yield from _journal_series(journal)

        hosts = GaugeMetricFamily("mcpl_router_host_connections", "Host connections open now.")
        hosts.add_metric([], float(len(connections)))
        yield hosts
        admission = parts.admission
        refused_hosts = CounterMetricFamily(
            "mcpl_router_host_connections_refused", "Host connections refused at accept, by reason (host.maxConnections, host.maxBufferedBytes).",
            labels=["reason"],
        )
        for at_accept, count in admission.refused.items():
            refused_hosts.add_metric([at_accept.value], float(count))
        closed_hosts = CounterMetricFamily(
            "mcpl_router_host_connections_timed_out", "Host connections closed for a deadline, by reason (a partial message, no hello).", labels=["reason"]
        )
        for timeout, count in admission.closed.items():
            closed_hosts.add_metric([timeout.value], float(count))
        buffered = GaugeMetricFamily("mcpl_router_host_buffered_bytes", "Bytes of unfinished messages held across all host connections now.")
        buffered.add_metric([], float(admission.buffered))
        pauses = CounterMetricFamily(
            "mcpl_router_accept_descriptor_pauses", "Times accepting a host connection paused because the process was out of file descriptors."
        )
        pauses.add_metric([], float(admission.descriptor_pauses))
        yield from (refused_hosts, closed_hosts, buffered, pauses)
        wakes = GaugeMetricFamily("mcpl_router_wakes_pending", "Wakes journaled for the agent and not acked yet.", labels=["agent"])
        unacked: dict[str, float] = {}
        for spec in parts.sessions.agents():
            label = self._metrics.agent_label(spec.name)
            unacked[label] = unacked.get(label, 0.0) + parts.journal.unacked_count(spec.name)
        for label, waiting in unacked.items():
            wakes.add_metric([label], waiting)
        yield wakes
        refusals = CounterMetricFamily("mcpl_router_resolution_refusals", "Channel names that picked no single channel, by kind.", labels=["kind"])
        for kind, count in parts.router.names.refusals.items():
            refusals.add_metric([kind], float(count))
        yield refusals
        typing = GaugeMetricFamily("mcpl_router_typing_active", "Typing indicators the daemon holds now (source: turn, host).", labels=["source"])
        for source, count in parts.turns.typing_statistics().items():
            typing.add_metric([source], float(count))
        yield typing
        turns = GaugeMetricFamily("mcpl_router_open_turns", "Turns open now.")
        turns.add_metric([], float(len(parts.turns.table.all())))
        yield turns
        reconciles = CounterMetricFamily(
            "mcpl_router_channel_reconciles",
            "Channels opened or closed again to match the agents' decisions after a server registered them, by outcome.",
            labels=["server", "action", "outcome"],
        )
        for (server_id, action, outcome), count in parts.channel_decisions.counts.items():
            reconciles.add_metric([server_id, action, outcome], float(count))
        yield reconciles
        ready = GaugeMetricFamily("mcpl_router_ready", "1 when /readyz answers 200.")
        ready.add_metric([], 0.0 if parts.readiness().problems else 1.0)
        yield ready


def _journal_series(stats: JournalStatistics) -> Iterator[Metric]:
    """The journal's own statistics (it commits in groups, in a thread)."""
    commits = CounterMetricFamily("mcpl_router_journal_commits", "Journal commits (each a group of writes).")
    commits.add_metric([], float(stats.commits))
    seconds = HistogramMetricFamily("mcpl_router_journal_commit_seconds", "How long each journal commit took, fsync included.")
    buckets = [(str(bound), float(count)) for bound, count in zip(COMMIT_SECONDS_BUCKETS, stats.commit_seconds_buckets, strict=False)]
    buckets.append(("+Inf", float(stats.commit_seconds_buckets[-1])))
    seconds.add_metric([], buckets, sum_value=stats.commit_seconds_total)
    last_batch = GaugeMetricFamily("mcpl_router_journal_last_batch_size", "Writes in the latest journal commit.")
    last_batch.add_metric([], float(stats.last_batch))
    high_water = GaugeMetricFamily(
        "mcpl_router_journal_batch_size_high_water_mark", "The most writes one journal commit has held since the daemon started."
    )
    high_water.add_metric([], float(stats.largest_batch))
    failing = GaugeMetricFamily("mcpl_router_journal_failing", "1 while the journal's commits keep failing.")
    failing.add_metric([], 0.0 if stats.failing is None else 1.0)
    pruned = CounterMetricFamily("mcpl_router_journal_pruned", "Rows pruned once acked or settled.", labels=["what"])
    pruned.add_metric(["events"], float(stats.pruned_events))
    pruned.add_metric(["drafts"], float(stats.pruned_drafts))
    failed = CounterMetricFamily("mcpl_router_journal_failed_commits", "Journal commits that failed (their writes not answered as durable).")
    failed.add_metric([], float(stats.failed_commits))
    again = CounterMetricFamily(
        "mcpl_router_journal_recorded_again", "Messages found written by a commit that had failed, recorded when their server re-sent them."
    )
    again.add_metric([], float(stats.recorded_again))
    yield from (commits, seconds, last_batch, high_water, failing, pruned, failed, again)


def _peer_series(
    stats: PeerStatistics,
    peer: str,
    owner: str,
    depth: GaugeMetricFamily,
    pending: GaugeMetricFamily,
    pressure: CounterMetricFamily,
    outbox_bytes: GaugeMetricFamily,
) -> None:
    depth.add_metric([f"{peer}-inbound", owner], float(stats.inbound_queued))
    depth.add_metric([f"{peer}-outbox", owner], float(stats.outbox_messages))
    pending.add_metric([peer, owner], float(stats.pending_requests))
    outbox_bytes.add_metric([peer, owner], float(stats.outbox_bytes))
    pressure.add_metric([peer, owner, "read-waits"], float(stats.backpressure_waits))
    pressure.add_metric([peer, owner, "write-waits"], float(stats.outbox_waits))
    pressure.add_metric([peer, owner, "stalled"], float(stats.stalled))
