"""What an agent reads: notices, bounces, receipts, the tools' descriptions and results, the
speech tools, tune-outs, the closed-channel invitation, a fork's fence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from mcpl_router.routing.texts.reasons import Reason
from mcpl_router.routing.texts.shown import quoted

#: What a turn's undelivered words are, in the receipt.
NOTHING_POSTED: Final = "Nothing was posted."


def own_channel_withdrawn(channel_id: str, server_id: str, not_done: str) -> str:
    """A turn's own channel its server no longer registers: never read as another server's."""
    return (
        f"Channel {quoted(channel_id)} on server {quoted(server_id)}, where this turn has been,"
        f" is no longer registered by that server. {not_done} Nothing can reach it until server"
        f" {quoted(server_id)} registers it again."
    )


def speech_lands_in(shown: str) -> str:
    """The routing line a turn is shown when its plain speech has a destination."""
    return f"[routing] Your plain speech now lands in {shown}."


SPEECH_HAS_NO_DESTINATION: Final = (
    "[routing] This turn has no channel, so your plain speech is not posted anywhere."
    " Use channel_publish with a channelId to speak in a channel."
)


def receipt(delivered: Sequence[str], held: int, failed: Sequence[str], unknown: Sequence[str]) -> str:
    """The turn's receipt: where plain speech went, then notes on what didn't go."""
    text = "[delivered] " + (", ".join(dict.fromkeys(delivered)) if delivered else "nothing")
    if held:
        text += f"\n{held} segment(s) had no destination and were held, not posted."
    if failed:
        text += "\nNot delivered (the server refused or was unreachable): " + ", ".join(failed) + "."
    if unknown:
        text += (
            "\nDelivery not confirmed: " + ", ".join(unknown) + ". Check the channel before"
            " sending the same words again."
        )
    return text


def unknown_tool(name: str) -> str:
    """A tool call the daemon offers no tool for."""
    return f"Unknown tool {quoted(name)}: no such tool is offered. Nothing was done."



def tool_not_permitted(name: str) -> str:
    """A tool the agent's allowed tools don't include, called anyway."""
    return f"{name} is not among the tools you may use here. Nothing was done."


# --- prose routing ---
# Every text prose routing gives an agent: notices, bounces, receipts, the named-mode system
# line, the speech tools' descriptions and prose_help. Read together, they are one voice.

#: The prefix of every routing notice an agent reads.
ROUTING: Final = "[routing]"


def speech_held(competing: Sequence[str]) -> str:
    """Several conversations woke the turn: plain speech is held rather than guessed."""
    places = ", ".join(competing)
    return (
        f"{ROUTING} More than one conversation is waiting on you ({places}), so your plain speech"
        " is held as drafts rather than guessed. Answer one with channel_publish and its channelId,"
        " or with the drafts tool's resend."
    )


SPEECH_NO_DESTINATION_HELD: Final = (
    f"{ROUTING} No conversation started this turn, so your plain speech is held as drafts, not"
    " posted. Use channel_publish with a channelId to speak in a channel."
)

SPEECH_PRIVATE_UNTIL_TARGET: Final = (
    f"{ROUTING} Your plain speech is private from here on: it is counted, never posted. A line"
    " starting >>> with a destination makes it public again."
)

SPEECH_HELD_UNTIL_TARGET: Final = (
    f"{ROUTING} Until you name a destination that works, your unprefixed plain speech is held as"
    " drafts, not posted. A line starting >>> with a destination sends it again."
)

#: Stable bounce reasons (in the notice's data and the draft's reason detail).
BOUNCE_NO_TARGET: Final = "no-target"
BOUNCE_UNKNOWN_TARGET: Final = "unknown-target"
BOUNCE_AMBIGUOUS_TARGET: Final = "ambiguous-target"
BOUNCE_NOT_DELIVERED: Final = "not-delivered"
BOUNCE_TAKES_NO_POSTS: Final = "takes-no-posts"
BOUNCE_UNSENT_UNAVAILABLE: Final = "unsent-unavailable"


def bounce(
    chars: int,
    why: str,
    draft_id: str,
    candidates: Sequence[str],
    *,
    prefix: str = ">>",
    example_target: str | None = None,
) -> str:
    """A bounced envelope: how much wasn't delivered, why, the candidates, how to resend.

    ``candidates`` are target tokens the grammar accepts (``>>a:general``), one per line.
    """
    text = f"{ROUTING} {chars} character(s) were not delivered: {why} They are kept as draft {draft_id}."
    if candidates:
        text += " Where you may have meant:\n" + "\n".join(f"- {c}" for c in candidates)
    target = example_target or "general"
    text += (
        f"\nTo send them, write a line {prefix}{target} {{{{unsent}}}} (the draft's words go where"
        f" {{{{unsent}}}} stands), or use the drafts tool: drafts resend {draft_id}."
        f" To set them aside, write {prefix}skip_reply {{{{unsent}}}}."
    )
    if prefix == ">>>":
        # Hybrid: >>>skip_reply also makes later unprefixed text private.
        text += " That also keeps your later unprefixed text private until a line names a destination."
    return text


def bounce_why_no_target(prefix: str = ">>") -> str:
    """Plain text with no target line and no sticky target yet."""
    return f"they named no destination, and no earlier line of this turn did. Begin a line with {prefix} and a destination."


def bounce_why_unknown(token: str) -> str:
    """A target no channel answers to."""
    return f"no channel answers to {quoted(token)}. channel_list lists the channels you can name."


def bounce_why_ambiguous(token: str) -> str:
    """A target several channels answer to."""
    return f"{quoted(token)} answers to more than one channel, so it doesn't say which one you mean."


def bounce_why_takes_no_posts(shown: str) -> str:
    """A target that only carries messages in."""
    return f"{shown} takes no posts (it only brings messages in)."


def bounce_why_not_delivered(shown: str, reason: str) -> str:
    """A delivery that failed."""
    return f"the delivery to {shown} failed ({reason})."


def unsent_not_recorded() -> str:
    """``{{unsent}}`` whose attempt the journal could not record: nothing left the daemon."""
    return (
        f"{ROUTING} {{{{unsent}}}} was not sent: the daemon could not record the attempt in its"
        " journal. Nothing was sent; the draft is kept. Try again in a moment."
    )


def unsent_unavailable(state: str | None) -> str:
    """``{{unsent}}`` with no bounced draft it may stand for."""
    if state is None:
        return f"{ROUTING} {{{{unsent}}}} stands for nothing: no draft of yours has bounced. Nothing was sent."
    return (
        f"{ROUTING} {{{{unsent}}}} was not sent: its draft is {state}. Nothing was sent. A draft whose"
        " earlier delivery was not confirmed goes again only through drafts resend with"
        " confirmDuplicate: true, after you checked the channel."
    )


def delivery_failed(shown: str, server_id: str, reason: str) -> str:
    """A plain-speech delivery that failed: nothing was drafted, the agent is told."""
    return f"{ROUTING} Your words to {shown} (server {quoted(server_id)}) were not delivered: {reason}. They were not kept as a draft."


def unsent_delivery_failed(shown: str, server_id: str, reason: str, draft_id: str, prefix: str = ">>") -> str:
    """A failed delivery of a bounced draft (``{{unsent}}``): where, why, and that it is still held."""
    return (
        f"{ROUTING} Your words to {shown} (server {quoted(server_id)}) were not delivered: {reason}."
        f" They are still held as draft {draft_id}: send it elsewhere with a line {prefix}<channel> {{{{unsent}}}}"
        f" or drafts resend {draft_id}, or set it aside with {prefix}skip_reply {{{{unsent}}}}."
    )


def delivery_unknown(shown: str, server_id: str, reason: str) -> str:
    """A delivery whose outcome is not known."""
    return (
        f"{ROUTING} Your words to {shown} (server {quoted(server_id)}) may or may not have arrived"
        f" ({reason}). Check the channel before sending them again."
    )


# -- named mode: the system line (one wording per kind of agent)

NAMED_LINE_PUBLISH: Final = (
    "Your plain text is never posted to any channel, in any turn. It stays in your own context,"
    " where this host's console and observers can see it. To say something in a channel or to a"
    " person, call a send tool and name where it goes: channel_publish with a channelId, or a tool"
    " that names a person or a message, such as a reply tool."
)
NAMED_LINE_NO_PUBLISH: Final = (
    "Your plain text is never posted to any channel, in any turn. It stays in your own context,"
    " where this host's console and observers can see it. To say something in a channel or to a"
    " person, call a send tool that names a channel, a person or a message."
)
NAMED_LINE_SUBAGENT: Final = (
    "Your plain text is never posted to any channel, in any turn. Your final reply goes back to"
    " whoever started you; any other plain text stays in your own context. To say something in a"
    " channel or to a person, call a send tool and name where it goes."
)


def named_line(*, may_publish: bool, subagent: bool) -> str:
    """The system-position line every request of a named agent's turns carries."""
    if subagent:
        return NAMED_LINE_SUBAGENT
    return NAMED_LINE_PUBLISH if may_publish else NAMED_LINE_NO_PUBLISH


# -- receipts


def receipt_places(places: Sequence[str]) -> str:
    """The head of a receipt: where plain speech went, each place once."""
    if not places:
        return "[delivered] nothing"
    return "[delivered] plain speech → " + " · ".join(dict.fromkeys(places))


def note_drafts(ids: Sequence[str]) -> str:
    return f"{len(ids)} draft(s) held, not posted: {', '.join(ids)} (the drafts tool lists, sends or dismisses them)"


def note_unconfirmed(places: Sequence[str]) -> str:
    return f"delivery not confirmed to {', '.join(dict.fromkeys(places))}: check before sending again"


def note_failed(places: Sequence[str]) -> str:
    return f"not delivered to {', '.join(dict.fromkeys(places))}"


def note_private(count: int) -> str:
    return f"{count} segment(s) private, counted and never posted"


def note_suppressed(count: int) -> str:
    return (
        f"{count} plain-speech segment(s) suppressed: prose routing is disabled for you, so only"
        " explicit send tools publish"
    )


def note_named(count: int) -> str:
    return (
        f"{count} plain-speech segment(s) kept in your context, sent to no one (only a send tool"
        " that names where it goes reaches anyone)"
    )


def prose_receipt(places: Sequence[str], notes: Sequence[str]) -> str:
    """``[delivered] plain speech → a · b — notes`` or ``[delivered] nothing — notes``."""
    head = receipt_places(places)
    return head + (" — " + "; ".join(notes) if notes else "")


# -- the drafts tool

DRAFTS_DESCRIPTION: Final = (
    "Your drafts: plain speech that was held instead of posted (no destination, several"
    " conversations, a bounce, or a round in which you already sent explicitly). action list"
    " (newest first, 10 a page; page), read (id: every attempt and the exact text), resend (ids"
    " and channelId: sends them in order, stopping at the first not confirmed; an unconfirmed"
    " draft needs confirmDuplicate: true), dismiss (ids)."
)
DRAFTS_NOTHING_SENT: Final = "Nothing was sent."


def draft_unknown(draft_id: str) -> str:
    return f"No draft of yours has id {quoted(draft_id)}. Nothing was done. drafts list shows your drafts."


def draft_not_resendable(draft_id: str, state: str) -> str:
    return f"Draft {draft_id} is {state}, so it was not sent. Nothing was sent."


def draft_needs_confirmation(draft_id: str) -> str:
    return (
        f"Draft {draft_id} was sent once and its delivery was not confirmed, so it may already be"
        " there. Nothing was sent. Check the channel; to send it again anyway, repeat the call with"
        " confirmDuplicate: true."
    )


def draft_no_destination(named: bool) -> str:
    if named:
        return (
            "Nothing was sent: a resend needs a channelId, since your words never go to a default"
            " channel. channel_list shows the channel ids."
        )
    return "Nothing was sent: this turn has no destination to resend to. Give a channelId; channel_list shows them."


def draft_dismissed(ids: Sequence[str]) -> str:
    return f"Dismissed {', '.join(ids)}. They will not be sent."


def draft_resent(rows: Sequence[str]) -> str:
    return "Resent: " + "; ".join(rows)


# -- the speech tools' descriptions (per mode)


#: skip_reply's description where plain text is routed, and where it never is.
SKIP_REPLY_DESCRIPTION_ROUTED: Final = (
    "End this turn without replying: the plain text of this round and of the rest of the turn"
    " stays private (counted, never posted or drafted)."
)
SKIP_REPLY_DESCRIPTION_NAMED: Final = (
    "End this turn without replying. Your plain text is never posted anyway; to reply,"
    " call a send tool that names where it goes."
)
SKIP_REPLY_DESCRIPTION_DISABLED: Final = "End this turn without replying. Your plain text is never posted; only send tools publish."

THINK_DESCRIPTION: Final = "Think out loud without anyone seeing it: the thought stays in your own context."
#: Added to think's description where plain text is routed.
THINK_DESCRIPTION_ROUTED: Final = " Plain text written in the same round is routed as usual."

SLEEP_DESCRIPTION_QUIET: Final = "Rest until something wakes you. Nothing is announced anywhere."
SLEEP_DESCRIPTION_ANNOUNCES: Final = (
    "Rest until something wakes you. announce (optional) is posted where your plain speech"
    " lands in this turn before you rest; nothing is announced for a call made outside the turn."
)


PROSE_HELP_DESCRIPTION: Final = "How your plain text is routed in your prose-routing mode, with its grammar."

SLEEP_NOT_ANNOUNCED: Final = "Resting. Nothing was announced."


def sleep_announced(shown: str) -> str:
    return f"Resting. Announced in {shown}."


SKIP_REPLY_DONE: Final = "No reply: the rest of this turn's plain text stays private."
THINK_DONE: Final = "Noted in your own context."

# prose_help's answer, per mode.
PROSE_HELP_EXPLICIT: Final = (
    "Explicit prose routing: your plain text goes only where a line tells it to.\n"
    "- A line starting >>target (no space after >>) begins an envelope: the words after it, on"
    " that line and the next ones, go to target. One message may hold several envelopes.\n"
    "- target is a channel's id, its label (#label or bare), a person (@name, or <@id> by their"
    " id, for a DM), or the qualified server:channel form (e.g. >>a:general) where two servers"
    " have the same id.\n"
    "- Within a turn, the id of a channel the turn has been in means that channel, on its server.\n"
    "- The first valid destination of a turn sticks: later text without a >> line goes there too.\n"
    "- >>target ! (a space, then !) asks for another turn right after this one.\n"
    "- >>skip_reply keeps what follows private (counted, never posted).\n"
    "- Text with no destination bounces: it is kept as a draft and you are told why. A line"
    " >>target {{unsent}} sends the latest bounced draft there; >>skip_reply {{unsent}} sets it aside.\n"
    "- Send tools (channel_publish, a server's send tools) work as always."
)
PROSE_HELP_HYBRID: Final = (
    "Hybrid prose routing: your unprefixed plain text goes to the conversation that woke you"
    " (your locus).\n"
    "- A line starting >>> target begins an envelope for that one destination (a channel's id,"
    " label, @person, <@id>, or server:channel); it then sticks, winning over the locus, until another"
    " >>> line or a channel_open that sets the speech target.\n"
    "- Within a turn, the id of a channel the turn has been in means that channel, on its server.\n"
    "- >>>skip_reply makes later unprefixed text private until a new destination.\n"
    "- A >>> destination that fails holds later unprefixed text as drafts until a new one works;"
    " those words are kept as a draft and you are told why. A line >>> target {{unsent}} sends the"
    " latest bounced draft there; >>>skip_reply {{unsent}} sets it aside.\n"
    "- Send tools work as always."
)
PROSE_HELP_LOCUS: Final = (
    "Locus prose routing: your plain text goes to the conversation that woke you (your locus),"
    " on its server. With no conversation, or several competing, it is held as drafts rather"
    " than guessed; a [routing] notice says when where it lands changes. Send tools work as always."
)
PROSE_HELP_DISABLED: Final = (
    "Prose routing is disabled for you: no plain text is ever posted, >> and >>> lines"
    " included. Only send tools publish."
)
PROSE_HELP_NAMED: Final = (
    "Named prose routing: your plain text is never posted nor handed to anyone, in any turn;"
    " it stays in your own context. To speak, call a send tool and name where it goes:"
    " channel_publish with a channelId, or a tool that names a person or a message."
)


# --- connector tools and tune-out ---



def connector_tool_disabled(name: str, tool: str, server_id: str) -> str:
    """A connector tool the server's enabledTools/disabledTools leave out, called anyway."""
    return (
        f"{name} (tool {quoted(tool)} of server {quoted(server_id)}) is disabled by this daemon's"
        " configuration for that server (enabledTools / disabledTools). Nothing was sent to the"
        " server. Use a tool that is offered in this turn."
    )


def connector_tool_gone(name: str, tool: str, server_id: str) -> str:
    """A connector tool its server no longer lists."""
    return (
        f"{name}: server {quoted(server_id)} no longer offers tool {quoted(tool)}. Nothing was"
        " sent to the server. Use a tool that is offered in this turn."
    )


def connector_server_unavailable(name: str, server_id: str) -> str:
    """A connector tool whose server is not connected (or not granted tools) now."""
    return (
        f"{name}: server {quoted(server_id)} is not reachable now (not connected, or its tools are"
        " not granted). Nothing was sent to the server. Try again once it is back."
    )


def connector_unconfirmed(name: str, server_id: str, seconds: float) -> str:
    """A connector call sent to its server with no answer in time: its outcome is unknown."""
    return (
        f"{name}: the call reached server {quoted(server_id)} but no answer came within"
        f" {seconds:g} s, so whether it took effect is unknown. Check (e.g. the channel's recent"
        " messages) before calling it again, or it may happen twice."
    )


def connector_failed(name: str, server_id: str, message: str) -> str:
    """A connector call its server answered with an error."""
    return f"{name}: server {quoted(server_id)} answered with an error: {message}"


def connector_send_opened(shown: str) -> str:
    """A connector send went to a channel the daemon held closed: it is open now."""
    return f"[channels] {shown} was closed; your send opened it, so its messages reach you again."


NOTHING_TUNED: Final = "Nothing was tuned out."
NOTHING_CANCELLED: Final = "No tune-out was cancelled."
NOTHING_DELIVERED: Final = "Nothing was delivered."



def tuneout_entered(shown: str, cadence: float, backlog_cap: int, ends: str) -> str:
    """tune_out's answer: the channel stays open, its traffic comes as a summary wake."""
    return (
        f"[tune-out] {shown} is tuned out: it stays open, but its messages no longer wake you one"
        f" by one. They are held (the newest {backlog_cap} kept) and come as one summary wake"
        f" every {cadence:g} s. {ends}"
    )


def tuneout_ends(duration: float | None, max_wakes: int | None, shown: str) -> str:
    """How a tune-out ends; one place, so every text says the same."""
    parts = []
    if duration is not None:
        parts.append(f"after {duration:g} s")
    if max_wakes is not None:
        parts.append(f"after {max_wakes} summary wake(s)")
    when = " or ".join(parts) if parts else "only when cancelled"
    return f"The tune-out ends {when}, or at once with tune_out {{channelId: {quoted(shown)}, op: \"cancel\"}}."


def tuneout_cancelled(shown: str, held: int) -> str:
    """A tune-out ended by tune_out cancel or cancel_tuneout."""
    text = f"[tune-out] {shown} is no longer tuned out: its messages wake you again."
    if held:
        text += f" The {held} message(s) held meanwhile come now as one last summary wake."
    return text


def tuneout_not_tuned_out(shown: str, not_done: str) -> str:
    """A cancel of a channel that is not tuned out."""
    return f"{shown} is not tuned out. {not_done} tune_out with op \"enter\" tunes a channel out."


def tuneout_summary_text(shown: str, count: int, dropped: int, summary: str | None) -> str:
    """A summary wake's text: how much was held, and a delivered summary if there is one."""
    text = f"[tune-out] {shown}: {count} message(s) held while tuned out"
    if dropped:
        text += f" ({dropped} older one(s) dropped past the backlog cap)"
    text += "."
    if summary:
        text += f" Summary: {summary}"
    return text


def tuneout_bad_argument(field: str, problem: str, not_done: str) -> str:
    """A tune_out argument that can't be used."""
    return f"{field} {problem}. {not_done}"


def not_subconscious(name: str, not_done: str) -> str:
    """A subconscious tool called by an agent that isn't one."""
    return (
        f"{name} is for a subconscious agent (one declared with subconsciousFor). {not_done}"
        " Use tune_out with op \"cancel\" for your own tune-outs, channel_publish to post."
    )


def summary_delivered(shown: str, agent: str) -> str:
    """deliver_summary's answer."""
    return f"Summary of {shown} delivered to {quoted(agent)}; it comes with that channel's next summary wake."


def spoke_in(shown: str) -> str:
    """speak_in_channel's answer."""
    return f"Posted in {shown}."


# --- channel tools ---
# What channel_list, channel_open, channel_close, channel_decline and channel_publish tell the
# agent (descriptions, results, refusals), and a host's channels/publish refusals. Each refusal
# says what was not done and what would work; no schema changes with shared ids.

PUBLISH_NOT_SENT: Final = "Nothing was sent."
OPEN_NOT_DONE: Final = "Nothing was opened."
CLOSE_NOT_DONE: Final = "Nothing was closed."
DECLINE_NOT_DONE: Final = "Nothing was declined."

CHANNEL_ID_DESCRIPTION: Final = (
    "The channel's id as channel_list shows it, or serverId:channelId where the id is on more"
    " than one server."
)
SERVER_ID_DESCRIPTION: Final = "The channel's server; with channelId it names exactly that pair. Optional."

CHANNEL_LIST_DESCRIPTION: Final = (
    "List every registered channel with its server, label, direction, whether it is open, and what"
    " you last decided for it (open, closed or declined). A row whose id is on another server too"
    " has a name (serverId:channelId): give that name as channelId to pick it."
)
CHANNEL_OPEN_DESCRIPTION: Final = (
    "Join a channel: its messages reach you from now on. By default your plain speech then lands"
    " there for the rest of this turn (setSpeechTarget: false keeps it where it is)."
)
CHANNEL_CLOSE_DESCRIPTION: Final = "Leave a channel: its messages stop reaching you. Nothing is posted there."
CHANNEL_DECLINE_DESCRIPTION: Final = (
    "Stay out of a channel that invited you, and remember that choice. Optionally acknowledge the"
    " message that invited you with an emoji (acknowledge)."
)
CHANNEL_PUBLISH_DESCRIPTION: Final = (
    "Post a message to a channel. With no channelId it goes to your default channel: the channel of"
    " the latest message that woke you."
)
CHANNEL_PUBLISH_NAMED_DESCRIPTION: Final = (
    "Post a message to a channel. channelId is required: nothing is sent to a default channel."
    " channel_list shows the channel ids."
)


def publish_needs_channel_id() -> str:
    """A ``named`` agent's channel_publish with no channelId (seed 002's wording intent)."""
    return (
        "Nothing was posted: channel_publish needs a channelId, since nothing is sent to a default"
        " channel. channel_list shows the channel ids."
    )


def publish_no_default(not_done: str) -> str:
    """channel_publish with no channelId before any message set a default channel."""
    return (
        f"You have no default channel yet: no message has woken you since the daemon started."
        f" {not_done} Give a channelId; channel_list lists the channels."
    )


def default_gone(shown: str, channel_id: str, server_id: str, not_done: str) -> str:
    """The default channel's server no longer registers it. Names it, and no other channel."""
    return (
        f"Your default channel, {shown} (channel {quoted(channel_id)} on server {quoted(server_id)}),"
        f" is no longer registered by its server. {not_done} Nothing can reach it until server"
        f" {quoted(server_id)} registers it again."
    )


def default_not_on_server(channel_id: str, server_id: str, not_done: str) -> str:
    """A serverId given alone, and that server has no channel with the default's id."""
    return (
        f"Server {quoted(server_id)} has no channel {quoted(channel_id)}, your default channel's id."
        f" {not_done} Leave serverId out to post to your default channel, or give a channelId."
    )


def publish_no_content() -> str:
    """channel_publish with nothing to post."""
    return "Nothing was sent: channel_publish needs the words to post, as content."


def published(shown: str, server_id: str, message_id: str | None) -> str:
    """A publish the server confirmed."""
    tail = f" (message {quoted(message_id)})" if message_id else ""
    return f"Posted to {shown} on server {quoted(server_id)}{tail}."


def publish_failed(shown: str, reason: Reason | None) -> str:
    """A publish that never went out, or the server refused."""
    why = _DELIVERY_WHY.get(reason, "the server did not take it") if reason is not None else "the server did not take it"
    return f"Nothing was posted to {shown}: {why}. Try again later, or post elsewhere."


def publish_not_there(shown: str, channel_id: str, places: Sequence[str]) -> str:
    """A host's publish to an exact ref its server doesn't register: where the id is instead,
    with no advice to post there (each place is another destination)."""
    head = f"Nothing was posted to {shown}: that server has no such channel."
    if not places:
        return head
    where = places[0] if len(places) == 1 else ", ".join(places[:-1]) + f" and {places[-1]}"
    return f"{head} A channel {quoted(channel_id)} is on {where}."


def publish_unconfirmed(shown: str) -> str:
    """A publish that went out with no confirmation."""
    return (
        f"Sent to {shown}, but its server did not confirm delivery. Check the channel before sending"
        " the same words again."
    )


_DELIVERY_WHY: Final[Mapping[Reason, str]] = {
    Reason.NO_LINK: "its server is not connected now",
    Reason.NOT_PERMITTED: "its server is not granted channels.publish",
    Reason.NOT_REGISTERED: "its server no longer registers it",
    Reason.SERVER_REFUSED: "its server refused the publish",
    Reason.NOT_DELIVERED: "its server said it was not delivered",
    Reason.TIMEOUT: "its server did not answer in time",
}


def lifecycle_failed(verb: str, shown: str, reason: Reason, not_done: str) -> str:
    """channel_open/close that its server refused or couldn't be asked."""
    why = _DELIVERY_WHY.get(reason, "its server did not take it")
    return f"Could not {verb} {shown}: {why}. {not_done} Try again later."


def reopen_failed(shown: str, server_id: str, reason: Reason) -> str:
    """A channel the agent opened, registered closed again by its server (it restarted, or the
    daemon did), that the daemon could not open again."""
    why = _DELIVERY_WHY.get(reason, "its server did not take it")
    return (
        f"[channels] You opened {shown}, and server {quoted(server_id)} registered it closed again;"
        f" opening it again failed: {why}. Its messages don't reach you until it is open:"
        f" channel_open {shown} to try again."
    )


def lifecycle_not_granted(verb: str, shown: str, server_id: str, not_done: str) -> str:
    """A server without channels.lifecycle: the daemon can't ask it to open or close."""
    return (
        f"Could not {verb} {shown}: server {quoted(server_id)} is not granted channels.lifecycle,"
        f" so the daemon can't ask it to. {not_done} Its operator decides which of its channels are open."
    )


def lifecycle_unconfirmed(verb: str, shown: str) -> str:
    """A channels/open or close that went out without an answer."""
    return (
        f"Asked to {verb} {shown}, but its server did not answer in time; it may or may not have."
        " channel_list shows what the daemon knows."
    )


def opened(shown: str, server_id: str, *, speech_here: bool, outside_turn: bool) -> str:
    """channel_open's answer."""
    text = f"Opened {shown} on server {quoted(server_id)}: its messages reach you from now on."
    if outside_turn:
        return text + " This call was made outside your current turn, so that turn's speech didn't move."
    if speech_here:
        text += f" Your plain speech now lands in {shown}."
    return text


def closed(shown: str, server_id: str) -> str:
    """channel_close's answer."""
    return f"Closed {shown} on server {quoted(server_id)}: its messages no longer reach you."


def declined(shown: str, server_id: str, acknowledged: str | None) -> str:
    """channel_decline's answer, with what became of the acknowledgement."""
    text = f"Declined {shown} on server {quoted(server_id)}; the daemon remembers it."
    if acknowledged:
        text += f" {acknowledged}"
    return text


ACK_SENT: Final = "The acknowledgement was sent."
ACK_NO_MESSAGE: Final = (
    "No acknowledgement was sent: no message of that channel is known to acknowledge; give messageId."
)


def ack_not_sent(reason: Reason) -> str:
    """An acknowledgement that didn't go out (or went out with no word that it landed)."""
    if reason == Reason.UNCONFIRMED:
        return "The acknowledgement was sent, but its server gives no answer to say it landed."
    why = _DELIVERY_WHY.get(reason, "its server did not take it")
    return f"No acknowledgement was sent: {why}."


def channel_row(shown: str, server_id: str, label: str, direction: str, is_open: bool, desired: str | None) -> str:
    """One line of channel_list."""
    state = "open" if is_open else "closed"
    line = f"- {shown} (server {quoted(server_id)}, label {quoted(label)}, {direction}, {state}"
    if desired is not None:
        line += f", you {desired} it" if desired != "open" else ", you opened it"
    return line + ")"


def channel_listing(lines: Sequence[str]) -> str:
    """channel_list's text."""
    if not lines:
        return "No channel is registered now."
    return "Channels:\n" + "\n".join(lines)


def channel_tuned_out(verb: str, shown: str, server_id: str, ends: str, not_done: str) -> str:
    """channel_open/close/decline of a channel the agent tuned out (it stays open, summarised)."""
    return (
        f"Can't {verb} {shown} on server {quoted(server_id)}: you tuned it out, so it stays open and"
        f" its traffic comes to you as summaries. {not_done} {ends}"
    )


# --- prose routing: the closed-channel invitation ---


def invitation(
    author: str | None, shown: str, reply: str, *, channel_id: str, server_id: str
) -> str:
    """The block a wake carries when a message addresses the agent in a channel it hasn't joined.

    ``reply`` is the first option's sentence, built per mode (:func:`invitation_reply_*`).
    """
    who = f"{author} addressed you" if author else "You were addressed"
    return (
        f"[channels] {who} in {shown}, a channel you have not joined: only messages there that"
        " address you reach you.\n"
        f"1. Reply without joining: {reply}\n"
        f"2. Join: channel_open with channelId {quoted(channel_id)} and serverId {quoted(server_id)}"
        " (optionally with backscroll).\n"
        f"3. Stay out: channel_decline with channelId {quoted(channel_id)} and serverId"
        f" {quoted(server_id)} (optionally acknowledging with an emoji).\n"
        "4. Do nothing."
    )


def invitation_reply_prefix(token: str) -> str:
    return f"begin a line with {token} and write your reply after it."


def invitation_reply_locus() -> str:
    return "answer in plain text in the turn this message starts; it goes to that channel."


def invitation_reply_publish(name: str) -> str:
    return f"call channel_publish with channelId {quoted(name)}."


INVITATION_REPLY_NONE: Final = (
    "no name reaches that channel alone from here; check whether its server offers a send tool"
    " that can address it."
)
INVITATION_REPLY_SEND_TOOL: Final = (
    "check whether its server offers a send tool that can address it (your plain text is never"
    " posted)."
)


def untold_drafts(ids: Sequence[str]) -> str:
    """Drafts made where no receipt named them (a turn that ended without closing)."""
    return (
        f"{ROUTING} {len(ids)} draft(s) of yours were held and not yet mentioned: {', '.join(ids)}."
        " The drafts tool lists, sends or dismisses them."
    )


# --- conversation forks: the channel fence (routing/fork_fence.py) ---

_FORK_DONE: Final = {"publish": "posted", "close": "closed", "decline": "declined", "open": "opened"}


def fork_cannot_open(home_shown: str, asked: str) -> str:
    """A fork's channel_open: a fork acts only on its home, which is open already."""
    return (
        f"Nothing was opened: you asked for {asked}, but you are this conversation's fork, and a fork"
        f" opens no channels. Your channel is {home_shown}; speak there, or let the main agent open others."
    )


def fork_not_home(verb: str, home_shown: str, asked: str, not_done: str) -> str:
    """A fork's call naming a channel that isn't its home."""
    return (
        f"Can't {verb} {asked}: you are this conversation's fork, and you may {verb} only your own"
        f" channel, {home_shown}. {not_done} Leave channelId out, or give {home_shown}."
    )


def fork_name_works_alone(verb: str, home_shown: str, server_id: str, not_done: str) -> str:
    """A fork gave its home's qualified name with its home's serverId: that pair names no channel."""
    return (
        f"Can't {verb} that: {home_shown} with serverId {quoted(server_id)} names no channel (a serverId"
        f" beside a channelId takes the channel's own id). {not_done} Give {home_shown} alone, or leave"
        " channelId out: either means your channel."
    )


def fork_home_gone(verb: str, home_shown: str, server_id: str) -> str:
    """A fork whose home its server no longer registers."""
    done = _FORK_DONE.get(verb, verb)
    return (
        f"Nothing was {done}: your channel {home_shown} is no longer registered by server {quoted(server_id)},"
        f" and nothing can be {done} there until its server registers it again."
    )
