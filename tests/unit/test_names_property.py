"""Property test: the resolver, refusals, shown names and listing against a brute-force oracle.

Servers ``a``, ``a:b``, ``c`` and ``b`` register, withdraw, push and leave, with ids drawn from a
small alphabet chosen to collide: ids with colons, ids equal to another channel's qualified name
(``a``'s ``b:room`` and ``a:b``'s ``room`` both answer to ``a:b:room``), DMs whose labels differ
only in case or equal another channel's id. After every step, every invariant is checked
against an oracle that scans every registered channel.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mcpl_router.routing import texts
from mcpl_router.routing.names import ChannelNames, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelEntry, ChannelRegistry, RegistrationPolicy

FULL = RegistrationPolicy.permissive()
SERVERS = ["a", "a:b", "c", "b"]
IDS = ["room", "b:room", "general", "a:b", "b", "a:b:room", "c:room", "dm:1", "a:general", "A:B", "Ada"]
LABELS = ["Ada", "ada", "general", "room", "a:b:room", "b:room", "B", ""]
TYPES = ["channel", "dm"]

servers = st.sampled_from(SERVERS)
ids = st.sampled_from(IDS)

register_op = st.tuples(st.just("register"), servers, ids, st.sampled_from(TYPES), st.sampled_from(LABELS))
withdraw_op = st.tuples(st.just("withdraw"), servers, ids)
push_op = st.tuples(st.just("push"), servers, ids)
change_op = st.tuples(st.just("change"), servers, ids, ids)
remove_op = st.tuples(st.just("remove"), servers)
ops = st.lists(
    st.one_of(register_op, register_op, register_op, withdraw_op, push_op, change_op, remove_op),
    min_size=1,
    max_size=30,
)
random_names = st.lists(st.text(alphabet="abcrom:ABdgl1 ", max_size=9), max_size=6)


def apply(registry: ChannelRegistry, op: tuple) -> None:
    kind = op[0]
    if kind == "register":
        _, server, channel_id, channel_type, label = op
        registry.register(server, [{"id": channel_id, "type": channel_type, "label": label}], FULL)
    elif kind == "withdraw":
        registry.withdraw(op[1], [op[2]])
    elif kind == "push":
        registry.push_channel(op[1], FULL, mcpl_channel_id=op[2])
    elif kind == "change":
        registry.change(op[1], added=[{"id": op[2]}], removed=[op[3]], updated=[], policy=FULL)
    else:
        registry.remove_server(op[1])


def answers(entry: ChannelEntry, name: str) -> bool:
    descriptor = entry.descriptor
    return (
        entry.ref.channel_id == name
        or entry.ref.qualified_name == name
        or (descriptor.is_dm and bool(descriptor.label) and descriptor.label.casefold() == name.casefold())
    )


def oracle(registry: ChannelRegistry, name: str) -> list[ChannelRef]:
    """Brute force: scan every channel, in registration order."""
    if not name:
        return []
    return [entry.ref for entry in registry.all_entries() if answers(entry, name)]


def oracle_pick(registry: ChannelRegistry, ref: ChannelRef) -> str | None:
    if oracle(registry, ref.channel_id) == [ref]:
        return ref.channel_id
    if oracle(registry, ref.qualified_name) == [ref]:
        return ref.qualified_name
    return None


def check(names: ChannelNames, extra_names: list[str], seen: set[ChannelRef]) -> None:
    registry = names.registry
    entries = registry.all_entries()
    refs = [entry.ref for entry in entries]

    # The indexes agree with a scan.
    for entry in entries:
        assert entry.ref in registry.refs_with_id(entry.ref.channel_id)
        assert entry.ref in registry.refs_with_qualified_name(entry.ref.qualified_name)
    for server in SERVERS:
        assert [e.ref for e in registry.channels_for(server)] == [r for r in refs if r.server_id == server]

    candidates_names = set(extra_names) | set(SERVERS) | set(IDS) | set(LABELS)
    for ref in refs + sorted(seen):
        candidates_names |= {ref.channel_id, ref.qualified_name, names.name_shown(ref)}
    for entry in entries:
        candidates_names.add(entry.descriptor.label)

    for name in sorted(candidates_names):
        labelled = [e.ref for e in entries if name and e.descriptor.label.casefold() == name.casefold()]
        assert names.channels_labelled(name) == labelled
        expected = oracle(registry, name)
        assert names.channels_named(name) == expected, name
        result = names.channel_named(name, not_done="Nothing was sent.")
        if not name:
            assert isinstance(result, Refusal) and result.kind == "no-name"
        elif len(expected) == 1:
            assert result == Resolved(expected[0], "one-match")
        elif not expected:
            assert isinstance(result, Refusal) and result.kind == "unknown", name
        else:
            assert isinstance(result, Refusal) and result.kind == "ambiguous", name
            assert list(result.candidates) == expected
            assert "not found" not in result.text.lower()
            assert "Nothing was sent." in result.text
            lines = [line[2:] for line in result.text.splitlines() if line.startswith("- ")]
            assert len(lines) == len(expected)
            for ref, line in zip(expected, lines, strict=True):
                picked = names.pick_name(ref)
                if picked is not None:
                    # Each candidate, given back as a name, is exactly that one channel.
                    assert line == picked
                    assert names.channels_named(picked) == [ref]
                else:
                    route = f"channelId {json.dumps(ref.channel_id)} with serverId {json.dumps(ref.server_id)}"
                    assert route in line

    for ref in refs:
        picked = names.pick_name(ref)
        assert picked == oracle_pick(registry, ref)
        shown = names.name_shown(ref)
        if picked is not None:
            assert shown == picked
            assert names.channels_named(shown) == [ref]
        else:
            assert shown == texts.unnamed_channel(ref.channel_id, ref.server_id)
            assert names.channels_named(shown) == []
        # serverId + channelId is the exact pair, whatever else answers to the id.
        assert names.channel_named(ref.channel_id, server_id=ref.server_id) == Resolved(ref, "exact-pair")
        assert registry.admit_incoming(ref.server_id, ref.channel_id, FULL).ref == ref

    # A channel no longer registered is shown by something that names no channel now.
    for ref in seen - set(refs):
        assert names.channels_named(names.name_shown(ref)) == []
        admission = registry.admit_incoming(ref.server_id, ref.channel_id, FULL)
        assert not admission.accepted and admission.code == -32023

    rows = names.channel_list()
    assert [row.ref for row in rows] == refs
    for row in rows:
        assert row.shown == names.name_shown(row.ref)
        if row.name is not None:
            assert names.channels_named(row.name) == [row.ref]
            assert names.channels_named(row.channel_id) != [row.ref]
        else:
            assert names.channels_named(row.channel_id) == [row.ref] or names.pick_name(row.ref) is None


@settings(max_examples=300, deadline=None)
@given(ops=ops, extra_names=random_names)
def test_resolver_matches_the_oracle_through_random_histories(ops: list[tuple], extra_names: list[str]) -> None:
    registry = ChannelRegistry()
    names = ChannelNames(registry)
    seen: set[ChannelRef] = set()
    for op in ops:
        apply(registry, op)
        seen |= {entry.ref for entry in registry.all_entries()}
        check(names, extra_names, seen)
