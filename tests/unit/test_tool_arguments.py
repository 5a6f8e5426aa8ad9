"""Each daemon tool's arguments are read once into one struct (issue 27 item 5), leniently:
an empty string is left out, a wrong type reads as absent, and only the tool refuses."""

from __future__ import annotations

from mcpl_router.routing.tuneout import DEFAULT_CADENCE, TuneOutSettings
from mcpl_router.tools.arguments import (
    ChannelArgs,
    DeclineArgs,
    DraftsArgs,
    OpenArgs,
    PublishArgs,
    SleepArgs,
    SpeakArgs,
    SummaryArgs,
    TuneOutArgs,
    text_of,
)


def test_arguments_a_model_leaves_empty_are_not_given() -> None:
    assert text_of({"channelId": ""}, "channelId") is None
    assert text_of({"channelId": 3}, "channelId") is None
    assert text_of({"channelId": "a:general"}, "channelId") == "a:general"
    assert ChannelArgs.read({"channelId": "general", "serverId": ""}) == ChannelArgs("general", None)


def test_a_publish_reads_its_words_from_content_then_text() -> None:
    assert PublishArgs.read({"content": "", "text": "hi"}).content == "hi"
    assert PublishArgs.read({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, "junk"]}).content == "ab"
    assert PublishArgs.read({"content": "   ", "text": 5}).content == ""
    assert PublishArgs.read({}) == PublishArgs("", ChannelArgs())
    assert PublishArgs.read({"text": "x", "channelId": "b:general", "threadId": "t"}) == PublishArgs("x", ChannelArgs("b:general"), "t")


def test_an_open_reads_backscroll_only_as_a_positive_whole_number_and_moves_speech_unless_told_not_to() -> None:
    assert OpenArgs.read({"channelId": "general", "backscroll": 20}).backscroll == 20
    for wrong in (0, -3, True, "20", 2.5):
        assert OpenArgs.read({"backscroll": wrong}).backscroll is None
    assert OpenArgs.read({}).set_speech_target is True
    assert OpenArgs.read({"setSpeechTarget": "no"}).set_speech_target is True
    assert OpenArgs.read({"setSpeechTarget": False}).set_speech_target is False
    assert OpenArgs.read({"beforeMessageId": "m1", "threadId": ""}) == OpenArgs(ChannelArgs(), None, "m1", None)


def test_a_decline_reads_its_reaction_and_message() -> None:
    assert DeclineArgs.read({"channelId": "general", "acknowledge": "👀", "messageId": "m1"}) == DeclineArgs(ChannelArgs("general"), "👀", "m1")
    assert DeclineArgs.read({"acknowledge": ""}).acknowledge is None


def test_drafts_read_ids_from_a_list_or_one_id_and_a_whole_page() -> None:
    assert DraftsArgs.read({"action": "resend", "ids": ["d1", 3, "d2"], "id": "d9"}).ids == ("d1", "d2")
    assert DraftsArgs.read({"id": "d9"}).ids == ("d9",)
    assert DraftsArgs.read({"page": "2"}).page == 1 and DraftsArgs.read({"page": 3}).page == 3
    assert DraftsArgs.read({"action": 7}).action == 7  # named back in the refusal as given
    assert DraftsArgs.read({"confirmDuplicate": "yes"}).confirm_duplicate is False
    assert DraftsArgs.read({"channelId": ""}).channel_id is None


def test_the_subconscious_tools_read_their_words_and_channel() -> None:
    assert SleepArgs.read({"announce": "  "}).announce == "" and SleepArgs.read({"announce": "brb"}).announce == "brb"
    assert SpeakArgs.read({"text": " ", "content": "from content", "channelId": "general"}) == SpeakArgs("from content", "general")
    assert SpeakArgs.read({"channelId": 4}).channel_name == ""
    assert SummaryArgs.read({"summary": " "}).summary == ""
    tune = TuneOutArgs.read({"channelId": "general"})
    assert (tune.op, tune.channel_name, tune.settings) == ("enter", "general", TuneOutSettings(cadence=DEFAULT_CADENCE))
    assert TuneOutArgs.read({"op": "", "cadence": "soon"}).settings == ("cadence", "must be a number of seconds")
