"""Each daemon tool's arguments, read once into one struct.

Models write arguments loosely, so reading is lenient and never a refusal by itself: an empty
string is how a model leaves a text out, and a value of the wrong type reads as absent (the
tool then says what is missing, in its own words). What a tool refuses (an unknown ``op``, an
empty summary) it refuses from the struct, not from the raw mapping; the raw mapping is read
nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from mcpl_router.routing.tuneout import TuneOutSettings

__all__ = [
    "ChannelArgs",
    "DeclineArgs",
    "DraftsArgs",
    "OpenArgs",
    "PublishArgs",
    "SleepArgs",
    "SpeakArgs",
    "SummaryArgs",
    "TuneOutArgs",
    "text_of",
]

#: The draft list's first page, when none (or no whole number) is given.
FIRST_PAGE: Final = 1


def text_of(arguments: Mapping[str, object], key: str) -> str | None:
    """A string argument; an empty string (a model's way of leaving it out) is None."""
    value = arguments.get(key)
    return value if isinstance(value, str) and value else None


def _channel_name(arguments: Mapping[str, object]) -> str:
    """``channelId`` as the subconscious tools read it: any string (the tool refuses an empty one)."""
    name = arguments.get("channelId")
    return name if isinstance(name, str) else ""


def _words(value: object) -> str:
    """A non-blank string's words, else ""."""
    return value if isinstance(value, str) and value.strip() else ""


@attrs.frozen
class ChannelArgs:
    """A channel named by ``channelId`` (a name, a qualified name, or an id with ``serverId``)."""

    channel_id: str | None = None
    server_id: str | None = None

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> ChannelArgs:
        return cls(text_of(arguments, "channelId"), text_of(arguments, "serverId"))


@attrs.frozen
class OpenArgs:
    """``channel_open``: the channel, backscroll (``history``), a thread, whether speech moves there."""

    channel: ChannelArgs
    backscroll: int | None = None
    before_message_id: str | None = None
    thread_id: str | None = None
    set_speech_target: bool = True

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> OpenArgs:
        backscroll = arguments.get("backscroll")
        return cls(
            channel=ChannelArgs.read(arguments),
            backscroll=backscroll if isinstance(backscroll, int) and not isinstance(backscroll, bool) and backscroll > 0 else None,
            before_message_id=text_of(arguments, "beforeMessageId"),
            thread_id=text_of(arguments, "threadId"),
            # Only an explicit false keeps speech where it is.
            set_speech_target=arguments.get("setSpeechTarget", True) is not False,
        )


@attrs.frozen
class DeclineArgs:
    """``channel_decline``: the channel, and the reaction (``acknowledge``) on which message."""

    channel: ChannelArgs
    acknowledge: str | None = None
    message_id: str | None = None

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> DeclineArgs:
        return cls(ChannelArgs.read(arguments), text_of(arguments, "acknowledge"), text_of(arguments, "messageId"))


@attrs.frozen
class PublishArgs:
    """``channel_publish``: the words (``content``: a string or text blocks; else ``text``), where, which thread."""

    content: str
    channel: ChannelArgs
    thread_id: str | None = None

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> PublishArgs:
        content = arguments.get("content")
        if isinstance(content, list):
            content = "".join(block["text"] for block in content if isinstance(block, dict) and isinstance(block.get("text"), str))
        words = _words(content) or _words(arguments.get("text"))
        return cls(words, ChannelArgs.read(arguments), text_of(arguments, "threadId"))


@attrs.frozen
class SleepArgs:
    """``sleep``: what to announce before sleeping ("" for nothing)."""

    announce: str = ""

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> SleepArgs:
        return cls(_words(arguments.get("announce")))


@attrs.frozen
class DraftsArgs:
    """``drafts``: the action (as given: an unknown one is named back), the drafts, the page,
    where a resend goes, and whether a duplicate resend is confirmed."""

    action: object = None
    ids: tuple[str, ...] = ()
    page: int = FIRST_PAGE
    channel_id: str | None = None
    confirm_duplicate: bool = False

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> DraftsArgs:
        ids = arguments.get("ids")
        single = arguments.get("id")
        if isinstance(ids, list):
            chosen = tuple(draft_id for draft_id in ids if isinstance(draft_id, str))
        else:
            chosen = (single,) if isinstance(single, str) else ()
        page = arguments.get("page", FIRST_PAGE)
        return cls(
            action=arguments.get("action"),
            ids=chosen,
            page=page if isinstance(page, int) else FIRST_PAGE,
            channel_id=text_of(arguments, "channelId"),
            confirm_duplicate=arguments.get("confirmDuplicate") is True,
        )


@attrs.frozen
class TuneOutArgs:
    """``tune_out`` (and ``cancel_tuneout``): ``op`` (``enter`` when absent), the channel, and
    the settings, or ``(field, problem)`` for the first bad one (refused by name)."""

    op: object = "enter"
    channel_name: str = ""
    settings: TuneOutSettings | tuple[str, str] = attrs.field(factory=TuneOutSettings)

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> TuneOutArgs:
        return cls(arguments.get("op") or "enter", _channel_name(arguments), TuneOutSettings.from_arguments(arguments))


@attrs.frozen
class SpeakArgs:
    """``speak_in_channel``: the words (``text``; else ``content``) and the channel."""

    text: str
    channel_name: str = ""

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> SpeakArgs:
        content = arguments.get("content")
        text = _words(arguments.get("text")) or (content if isinstance(content, str) else "")
        return cls(text, _channel_name(arguments))


@attrs.frozen
class SummaryArgs:
    """``deliver_summary``: the summary and its channel."""

    summary: str
    channel_name: str = ""

    @classmethod
    def read(cls, arguments: Mapping[str, object]) -> SummaryArgs:
        return cls(_words(arguments.get("summary")), _channel_name(arguments))
