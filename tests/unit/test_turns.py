"""Turn routing state (pure): refs only, ``wasIn`` add-only, one request's channel, own channels,
``calling_turn_of``, the host's typing targets; and the shell's publish outcomes over a
test-double link."""

from __future__ import annotations


import attrs
import pytest
import trio

from mcpl_router.jsonrpc import RequestTimeout, RpcError
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.link import LinkState
from mcpl_router.mcpl.session import ServerSession
from mcpl_router.routing.names import ChannelNames, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy
from mcpl_router.routing.turns import (
    KIND_OWN_CHANNEL_WITHDRAWN,
    RULE_OWN_CHANNEL,
    Delivery,
    MalformedChannel,
    Turn,
    TurnRouting,
    TurnTable,
    WakeFact,
    call_scope,
    own_channel_named,
    requested_channel,
    trigger_of,
)
from mcpl_router.routing.typing import host_typing_targets
from mcpl_router.turns import publish_text, wake_fact

A_GENERAL = ChannelRef("a", "general")
B_GENERAL = ChannelRef("b", "general")
B_RANDOM = ChannelRef("b", "random")


def registry_with(*refs: ChannelRef) -> ChannelRegistry:
    registry = ChannelRegistry()
    for ref in refs:
        registry.register(ref.server_id, [{"id": ref.channel_id}], RegistrationPolicy.permissive())
    return registry


@pytest.fixture(params=["a-first", "b-first"])
def shared(request: pytest.FixtureRequest) -> ChannelRegistry:
    """Servers a and b both register general (and b random), in both orders."""
    order = [A_GENERAL, B_GENERAL] if request.param == "a-first" else [B_GENERAL, A_GENERAL]
    return registry_with(*order, B_RANDOM)


def new_turn(trigger: ChannelRef | None, turn_id: str = "t1", agent: str = "ann") -> Turn:
    return Turn(turn_id=turn_id, inference_id="inf-" + turn_id, agent=agent, routing=TurnRouting.starting_at(trigger))


# ---------------------------------------------------------------------- wasIn


def test_a_new_turn_is_in_its_trigger_and_speaks_and_types_there() -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    assert routing.was_in == (B_GENERAL,)
    assert routing.locus == routing.typing_channel == routing.trigger == B_GENERAL


def test_a_turn_without_a_channel_is_in_none() -> None:
    routing = TurnRouting.starting_at(None)
    assert routing.was_in == () and routing.locus is None and routing.typing_channel is None


def test_was_in_adds_one_per_move_and_drops_none() -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    routing.moved_to(B_RANDOM)
    routing.moved_to(A_GENERAL, set_locus=True)
    routing.moved_to(B_RANDOM)  # already in: no duplicate
    assert routing.was_in == (B_GENERAL, B_RANDOM, A_GENERAL)
    assert routing.locus == A_GENERAL
    assert routing.trigger == B_GENERAL


def test_a_move_that_sets_the_locus_moves_typing_and_one_that_does_not_keeps_it() -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    routing.moved_to(B_RANDOM)  # an open that set no speech target (explicit mode): typing stays
    assert routing.typing_channel == B_GENERAL
    routing.moved_to(A_GENERAL, set_locus=True)  # speech moves (locus, hybrid): typing follows
    assert routing.typing_channel == A_GENERAL and routing.locus == A_GENERAL


def test_withdrawal_stops_only_that_refs_typing_and_keeps_was_in() -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    assert routing.withdrawn([A_GENERAL]) is None  # another server's general: untouched
    assert routing.typing_channel == B_GENERAL
    assert routing.withdrawn([B_GENERAL]) == B_GENERAL
    assert routing.typing_channel is None
    assert routing.was_in == (B_GENERAL,) and routing.locus == B_GENERAL


# ---------------------------------------------------------------------- one request's channel


def test_a_batched_turn_takes_channel_and_server_from_the_newest_addressed_wake() -> None:
    wakes = [
        WakeFact(1, A_GENERAL, addressed=True, message_id="m1"),
        WakeFact(2, B_GENERAL, addressed=True, message_id="m2", thread_id="th"),
        WakeFact(3, A_GENERAL, addressed=False, message_id="m3"),
    ]
    chosen = trigger_of(wakes)
    assert chosen is not None
    assert (chosen.channel, chosen.message_id, chosen.thread_id) == (B_GENERAL, "m2", "th")


def test_a_batched_turn_with_no_addressed_wake_takes_the_newest() -> None:
    chosen = trigger_of([WakeFact(5, B_GENERAL), WakeFact(4, A_GENERAL)])
    assert chosen is not None and chosen.channel == B_GENERAL
    assert trigger_of([]) is None


def test_a_wakes_ref_is_kept_whole_even_when_its_id_is_shared(shared: ChannelRegistry) -> None:
    # The wake's ref is taken as it is: never re-resolved from its bare id.
    chosen = trigger_of([WakeFact(1, B_GENERAL, addressed=True)])
    assert chosen is not None and chosen.channel == B_GENERAL


def test_a_host_name_that_means_several_channels_gives_no_channel_and_no_fallback(shared: ChannelRegistry) -> None:
    names = ChannelNames(shared)
    assert requested_channel(names, "general") is None
    assert requested_channel(names, "nowhere") is None
    assert requested_channel(names, "b:general") == B_GENERAL
    assert requested_channel(names, "random") == B_RANDOM


def test_a_host_ref_is_that_exact_pair_and_an_empty_server_is_malformed(shared: ChannelRegistry) -> None:
    names = ChannelNames(shared)
    assert requested_channel(names, {"serverId": "a", "channelId": "general"}) == A_GENERAL
    with pytest.raises(MalformedChannel):
        requested_channel(names, {"serverId": "", "channelId": "random"})
    with pytest.raises(MalformedChannel):
        requested_channel(names, {"channelId": "random"})


# ---------------------------------------------------------------------- own channels


def test_own_channel_named_means_the_turns_channel_on_its_server(shared: ChannelRegistry) -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    result = own_channel_named(routing, "general", shared)
    assert isinstance(result, Resolved) and result.ref == B_GENERAL and result.rule == RULE_OWN_CHANNEL
    # Not one of the turn's channels: the caller resolves it as any name.
    assert own_channel_named(routing, "random", shared) is None


def test_own_channel_withdrawn_is_refused_never_read_as_another_servers(shared: ChannelRegistry) -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    shared.withdraw("b", ["general"])
    assert shared.is_registered(A_GENERAL)
    result = own_channel_named(routing, "general", shared, not_done="Nothing was sent.")
    assert isinstance(result, Refusal)
    assert result.kind == KIND_OWN_CHANNEL_WITHDRAWN
    assert result.candidates == (B_GENERAL,)
    assert "Nothing can reach it until server \"b\" registers it again" in result.text
    assert "Nothing was sent." in result.text


def test_own_channels_on_two_servers_with_one_id_mean_neither(shared: ChannelRegistry) -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    routing.moved_to(A_GENERAL)
    assert own_channel_named(routing, "general", shared) is None


# ---------------------------------------------------------------------- calling_turn_of


def test_only_a_call_made_in_the_open_turn_reads_its_channels_or_moves_it() -> None:
    table = TurnTable()
    first = new_turn(B_GENERAL, "t1")
    table.add(first)
    assert table.calling_turn_of("t1", "ann") is first
    scope = call_scope(table, "ann", "t1")
    assert scope.turn is first and scope.own_channels == (B_GENERAL,) and scope.may_move_routing

    # A later turn supersedes it: a script started in t1 carries t1 and gets nothing of t2.
    second = new_turn(A_GENERAL, "t2")
    assert table.add(second) is first
    table.remove(first)
    assert table.calling_turn_of("t1", "ann") is None
    stale = call_scope(table, "ann", "t1")
    assert stale.turn is None and stale.own_channels == () and not stale.may_move_routing
    # Nor is another agent's turn lent, nor a call that carries no turn.
    assert table.calling_turn_of("t2", "bob") is None
    assert table.calling_turn_of(None, "ann") is None
    assert table.calling_turn_of("t2", "ann") is second


def test_turn_indexes_count_per_agent() -> None:
    table = TurnTable()
    assert [table.next_index("ann"), table.next_index("ann"), table.next_index("bob")] == [0, 1, 0]


# ---------------------------------------------------------------------- text per round


def test_text_is_buffered_per_round_and_taken_once() -> None:
    turn = new_turn(B_GENERAL)
    turn.add_text(1, "Hel")
    turn.add_text(2, "later")
    turn.add_text(1, "lo")
    assert turn.take_text(1) == "Hello"
    assert turn.add_text(1, "late") is False
    assert turn.unrouted_rounds() == [2]
    assert turn.take_text(1) == ""


# ---------------------------------------------------------------------- host typing


def test_host_typing_by_bare_id_fans_out_to_each_server(shared: ChannelRegistry) -> None:
    names = ChannelNames(shared)
    assert set(host_typing_targets(names, "general")) == {A_GENERAL, B_GENERAL}  # type: ignore[arg-type]


def test_host_typing_by_ref_or_qualified_name_types_there_alone(shared: ChannelRegistry) -> None:
    names = ChannelNames(shared)
    assert host_typing_targets(names, "b:general") == (B_GENERAL,)
    assert host_typing_targets(names, {"serverId": "a", "channelId": "general"}) == (A_GENERAL,)
    refused = host_typing_targets(names, "nowhere")
    assert isinstance(refused, Refusal) and "No typing was shown." in refused.text


# ---------------------------------------------------------------------- speech outcomes (shell)

@attrs.define
class PublishPort:
    """A server connection (the session's port): answers a publish request as told; records
    notifications. The real typed session runs over it (its Request-then-Notification rule too)."""

    answer: object
    grant: Grant = attrs.field(factory=lambda: Grant(effective=frozenset({"channels.publish"})))
    state: LinkState = LinkState.READY
    notified: list[tuple[str, object]] = attrs.field(factory=list)
    epoch: int = 1
    server_id: str = "b"

    @property
    def request_timeout(self) -> float:
        return 30.0

    async def call(self, method: str, params: object = None, *, capability: str | None, timeout: float | None = None,
                   result_type: type | None = None) -> object:
        await trio.lowlevel.checkpoint()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def send_notification(self, method: str, params: object = None, *, capability: str | None) -> None:
        self.notified.append((method, params))

    def send_notification_nowait(self, method: str, params: object = None, *, capability: str | None) -> bool:
        self.notified.append((method, params))
        return True


def session_of(answer: object, **port: object) -> ServerSession:
    return ServerSession(PublishPort(answer, **port))  # type: ignore[arg-type]


async def publish(session: ServerSession | None, *, registered: bool = True) -> Delivery:
    servers = {"b": session} if session is not None else {}
    return await publish_text(servers, B_GENERAL, "b:general", "hi", conversation_id="ann", round_=1, registered=registered)


@pytest.mark.parametrize(
    ("answer", "outcome", "reason"),
    [
        ({"delivered": True, "messageId": "m-1"}, "delivered", None),
        ({"delivered": False}, "failed", "not-delivered"),
        (RpcError(-32603, "no"), "failed", "server-refused"),
        (RequestTimeout("channels/publish", 1, sent=True), "unknown", "timeout"),
        (RequestTimeout("channels/publish", 1, sent=False), "failed", "timeout"),
        ({"ok": 1}, "unknown", "malformed-receipt"),
        (None, "unknown", "malformed-receipt"),
    ],
)
async def test_a_publish_is_delivered_only_on_an_explicit_receipt(answer: object, outcome: str, reason: str | None) -> None:
    delivery = await publish(session_of(answer))
    assert (delivery.outcome, delivery.reason) == (outcome, reason)
    assert delivery.ref == B_GENERAL


async def test_a_notification_only_server_gets_the_publish_as_a_notification_with_unknown_outcome() -> None:
    port = PublishPort(RpcError(-32601, "as a notification please"))
    session = ServerSession(port)
    delivery = await publish(session)
    assert delivery.outcome == "unknown" and delivery.reason == "no-receipt"
    assert [method for method, _ in port.notified] == ["channels/publish"]
    # Learned: the next one goes as a Notification without asking again.
    port.answer = AssertionError("asked again")
    assert (await publish(session)).reason == "no-receipt"
    assert [method for method, _ in port.notified] == ["channels/publish", "channels/publish"]


async def test_nothing_leaves_for_a_link_down_ungranted_or_unregistered_channel() -> None:
    ok = {"delivered": True}
    assert (await publish(None)).reason == "server-unavailable"
    assert (await publish(session_of(ok, state=LinkState.RETRYING))).outcome == "failed"
    assert (await publish(session_of(ok, grant=Grant()))).reason == "not-permitted"
    assert (await publish(session_of(ok), registered=False)).reason == "channel-not-registered"


def test_a_wakes_message_ids_come_from_its_payload() -> None:
    @attrs.frozen
    class FakeWake:
        seq: int
        channel: ChannelRef | None
        payload: object
        addressed: bool = True

    fact = wake_fact(FakeWake(3, B_GENERAL, {"channelId": "general", "messageId": "in-7", "threadId": "th-1"}))
    assert fact == WakeFact(3, B_GENERAL, addressed=True, message_id="in-7", thread_id="th-1")
    batch = wake_fact(FakeWake(4, None, {"messages": [{"messageId": "x"}, {"messageId": "y"}]}, addressed=False))
    assert (batch.channel, batch.message_id, batch.addressed) == (None, "y", False)
    # A push names its message in origin (discord-mcpl's push for a closed channel).
    push = wake_fact(FakeWake(5, B_GENERAL, {"eventId": "discord_msg_9", "origin": {"messageId": "9", "threadId": "t"}}))
    assert (push.message_id, push.thread_id) == ("9", "t")


def test_host_typing_by_a_name_that_is_an_id_and_a_qualified_name_is_refused() -> None:
    # Server "a" has "general"; server "x" has the id "a:general". "a:general" is x's id AND
    # a's qualified name: not a bare id to fan out over, but a name two channels answer to.
    registry = ChannelRegistry()
    registry.register("a", [{"id": "general"}], RegistrationPolicy.permissive())
    registry.register("x", [{"id": "a:general"}], RegistrationPolicy.permissive())
    names = ChannelNames(registry)
    assert isinstance(host_typing_targets(names, "a:general"), Refusal)
    assert host_typing_targets(names, "general") == (ChannelRef("a", "general"),)
    assert host_typing_targets(names, "x:a:general") == (ChannelRef("x", "a:general"),)
