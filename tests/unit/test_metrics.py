"""What the shell records into /metrics, read back through prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpl_router.config import parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.events import RegistrationsAnswered
from mcpl_router.hosts.admission import ConnectionRefusal, ConnectionTimeout
from mcpl_router.inference.refusals import ChunkDrop, InferenceRefusal
from mcpl_router.routing import texts
from mcpl_router.routing.registry import DescriptorResult, RegistrationPolicy


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    config = parse_config(
        {"mcplServers": {"a": {"url": "tcp://127.0.0.1:9", "required": True}}, "journal": {"path": str(tmp_path / "j.sqlite3")}},
        source="<t>",
        base_dir=tmp_path,
        environ={"HOME": str(tmp_path)},
    )
    built = Daemon(config)
    yield built
    built.journal.close()


def samples(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(daemon.metrics.render().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_inbound_answers_are_counted_by_outcome_and_code(daemon: Daemon) -> None:
    metrics = daemon.metrics
    # One channels/incoming answer (one accepted, two refused for a channel never registered)
    # and one push, as their handler tells them.
    metrics.inbound_answered("a", 1, [-32023, -32023])
    metrics.inbound_answered("a", 1)
    daemon.events.publish(RegistrationsAnswered("a", (
        DescriptorResult("g", True),
        DescriptorResult("h", False, texts.REASON_REGISTER_NOT_GRANTED, texts.RegistrationRefusal.NOT_GRANTED),
    )))
    found = samples(daemon)
    assert found[("mcpl_router_inbound_messages_total", (("code", ""), ("outcome", "accepted"), ("server", "a")))] == 2
    assert found[("mcpl_router_inbound_messages_total", (("code", "-32023"), ("outcome", "refused"), ("server", "a")))] == 2
    assert found[("mcpl_router_channel_registrations_total", (("outcome", "refused"), ("reason", "not-granted"), ("server", "a")))] == 1


def test_wakes_sent_are_counted_by_agent_and_read_at_each_scrape(daemon: Daemon) -> None:
    # Counted as plain integers per message, turned into the series when scraped: each scrape
    # reads the counts as they stand, in both exposition formats.
    metrics = daemon.metrics
    metrics.wake_sent("kai")
    metrics.wake_sent("kai")
    metrics.wake_sent("mo")
    assert samples(daemon)[("mcpl_router_wakes_sent_total", (("agent", "kai"),))] == 2
    metrics.wake_sent("kai")
    found = samples(daemon)
    assert found[("mcpl_router_wakes_sent_total", (("agent", "kai"),))] == 3
    assert found[("mcpl_router_wakes_sent_total", (("agent", "mo"),))] == 1
    page, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert b'mcpl_router_wakes_sent_total{agent="kai"} 3.0' in page
    assert b"# TYPE mcpl_router_wakes_sent counter" in page


def test_before_inference_outcomes_and_latency(daemon: Daemon) -> None:
    daemon.metrics.context_answered({"a": "ok", "b": "timeout", "c": "skipped"}, {"a": 0.02, "b": 5.0})
    found = samples(daemon)
    assert found[("mcpl_router_before_inference_total", (("outcome", "timeout"), ("server", "b")))] == 1
    assert found[("mcpl_router_before_inference_seconds_count", (("server", "a"),))] == 1
    assert found[("mcpl_router_before_inference_seconds_bucket", (("le", "0.025"), ("server", "a")))] == 1
    assert not any(labels == (("outcome", "skipped"), ("server", "c")) for _, labels in found)


def test_state_series_before_anything_connected(daemon: Daemon) -> None:
    found = samples(daemon)
    assert found[("mcpl_router_server_up", (("server", "a"),))] == 0
    assert found[("mcpl_router_server_required", (("server", "a"),))] == 1
    assert found[("mcpl_router_ready", ())] == 0  # a required server isn't serving
    assert found[("mcpl_router_journal_failing", ())] == 0
    assert found[("mcpl_router_journal_failed_commits_total", ())] == 0
    assert found[("mcpl_router_journal_recorded_again_total", ())] == 0


def test_each_registration_refusal_is_labelled_by_its_stable_value_not_its_sentence(daemon: Daemon) -> None:
    # Every way the registry refuses a descriptor, each counted under its own label.
    registry = daemon.router.registry
    policy = RegistrationPolicy(may_register=True, id_patterns=("ok-*",))
    results = [
        *registry.register("a", [{"id": "ok-dup", "type": "channel"}, {"id": "ok-dup", "type": "channel"}], policy, form="request"),
        *registry.register("a", [{"type": "channel"}], policy, form="request"),
        *registry.register("a", [{"id": "elsewhere", "type": "channel"}], policy, form="request"),
        *registry.register("a", [{"id": "ok-1", "type": "channel"}], RegistrationPolicy(may_register=False), form="request"),
        *registry.change("a", [], [], [{"id": "ok-2", "type": "channel"}], policy, form="request").results,
    ]
    daemon.events.publish(RegistrationsAnswered("a", tuple(results)))
    refused = {labels: value for (name, labels), value in samples(daemon).items()
               if name == "mcpl_router_channel_registrations_total" and ("outcome", "refused") in labels}
    assert {dict(labels)["reason"]: value for labels, value in refused.items()} == {
        "duplicate-in-call": 2, "malformed": 1, "outside-patterns": 1, "not-granted": 1, "update-unknown": 1,
    }
    assert {result.refusal for result in results} == set(texts.RegistrationRefusal)


def _labels(daemon: Daemon, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for (sample, labels), _ in samples(daemon).items() if sample == name}


def test_each_reason_enum_labels_its_series_by_the_values_dashboards_read(daemon: Daemon) -> None:
    # Every member of each reason enum, counted: the labels are the values they were as plain
    # strings (the dashboards' and docs/operations.md's), never an enum's name or its sentence.
    link = daemon.links["a"]
    for reason in texts.Reason:
        link.session.publishes[("failed", reason)] += 1
    link.session.publishes[("delivered", None)] += 1
    for refusal in texts.AdmissionRefusal:
        link.admission_refused[refusal] += 1
    for inference in InferenceRefusal:
        daemon.metrics.inference_outcome("a", "inference/request", inference)
    daemon.metrics.inference_outcome("a", "inference/request", "answered")
    for drop in ChunkDrop:
        daemon.metrics.inference_chunk(drop)
    daemon.metrics.inference_chunk("forwarded")
    daemon.admission.refused.update(set(ConnectionRefusal))
    daemon.admission.closed.update(set(ConnectionTimeout))

    assert _labels(daemon, "mcpl_router_publishes_total", "reason") == {
        "", "server-unavailable", "not-permitted", "channel-not-registered", "server-refused", "not-delivered",
        "timeout", "no-receipt", "malformed-receipt", "interrupted", "not-recorded", "tool-disabled",
        "unknown-tool", "unconfirmed", "tool-failed", "not-subconscious", "not-tuned-out", "bad-argument",
    }
    assert _labels(daemon, "mcpl_router_inbound_refused_at_admission_total", "reason") == {"not-granted", "before-policy"}
    assert _labels(daemon, "mcpl_router_inference_requests_total", "outcome") == {
        "answered", "no-host", "host-gone", "timeout", "too-many-concurrent", "rate-limited", "too-large", "host-error",
    }
    assert _labels(daemon, "mcpl_router_inference_chunks_total", "outcome") == {
        "forwarded", "unknown-request", "not-asked", "not-streaming", "server-gone",
    }
    assert _labels(daemon, "mcpl_router_host_connections_refused_total", "reason") == {"too-many-connections", "buffered-bytes-over-budget"}
    assert _labels(daemon, "mcpl_router_host_connections_timed_out_total", "reason") == {"partial-message-timeout", "no-hello"}
