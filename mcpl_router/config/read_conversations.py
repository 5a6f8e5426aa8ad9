"""Reading conversation forks (``agents.<name>.conversations``, or ``conversations`` in a hello's
agent spec): the template, the per-kind ``trigger``/``bind`` rules, the idle TTL, the closure
prompt and the fork name prefix (docs/forks.md).

One reader for both, as :mod:`mcpl_router.config.read_gate` is: the config's problems carry the
file and key; a hello's carry ``session/hello``. Every problem has its key, what is wrong and a
fix, with a "did you mean" where a word is close to a known one.
"""

from __future__ import annotations

import json
from typing import Final

from mcpl_router.config.errors import show_value
from mcpl_router.config.section_reader import Section
from mcpl_router.routing.forks import (
    DEFAULT_CLOSURE_PROMPT,
    DEFAULT_IDLE_TTL,
    DEFAULT_PREFIX,
    DEFAULT_RULES,
    KINDS,
    RULES,
    ConversationsSpec,
    KindRules,
)

CONVERSATIONS_KEYS: Final = ("template", *KINDS, "idleTtl", "closurePrompt", "forkPrefix")
KIND_KEYS: Final = ("trigger", "bind")
#: An idle TTL of at most a week, at least a second.
MAX_IDLE_TTL: Final = 7 * 86_400.0
_NAME_FIX: Final = "Write a name without whitespace, e.g. \"kai\"."
_PREFIX_FIX: Final = 'Write a prefix without whitespace, e.g. forkPrefix = "kai-"; fork names are <prefix><server>-<channel>-<n>.'


def parse_conversations(agent: Section, agent_name: str) -> ConversationsSpec | None:
    """``conversations`` of one agent's section (absent: the agent doesn't fork)."""
    if not agent.given("conversations"):
        return None
    section = agent.table("conversations", CONVERSATIONS_KEYS, "conversations")
    template = section.string("template", agent_name, fix=_NAME_FIX) or agent_name
    if any(char.isspace() for char in template):
        section.error("template", f"{json.dumps(template)} is not an agent name: it has whitespace.", _NAME_FIX)
        template = agent_name
    rules: dict[str, KindRules] = {}
    for kind in KINDS:
        default = DEFAULT_RULES[kind]
        if not section.given(kind):
            rules[kind] = default
            continue
        rule = section.table(kind, KIND_KEYS, f"conversations.{kind}")
        rules[kind] = KindRules(
            trigger=rule.choice("trigger", RULES, default.trigger, "a fork trigger rule"),
            bind=rule.choice("bind", RULES, default.bind, "a fork bind rule"),
        )
    idle_ttl = section.number("idleTtl", DEFAULT_IDLE_TTL, at_least=1.0, at_most=MAX_IDLE_TTL)
    prompt = section.string("closurePrompt", DEFAULT_CLOSURE_PROMPT, fix="Write the words a fork is given as it is released.")
    prefix = section.string("forkPrefix", DEFAULT_PREFIX, fix=_PREFIX_FIX) or DEFAULT_PREFIX
    if any(char.isspace() for char in prefix):
        section.error("forkPrefix", f"{show_value(prefix)} has whitespace: fork names are agent names.", _PREFIX_FIX)
        prefix = DEFAULT_PREFIX
    return ConversationsSpec(
        template=template,
        rules=rules,
        idle_ttl=idle_ttl,
        closure_prompt=prompt or DEFAULT_CLOSURE_PROMPT,
        fork_prefix=prefix,
    )
