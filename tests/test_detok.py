from llmctl.runtime.engine.detok import StopMatcher, Utf8Decoder


def test_multibyte_character_split_across_tokens_is_emitted_whole():
    emoji = "🦙".encode()          # 4 bytes
    stream = Utf8Decoder()
    assert stream.feed(emoji[:1]) == ""
    assert stream.feed(emoji[1:3]) == ""
    assert stream.feed(emoji[3:] + b" ok") == "🦙 ok"
    assert stream.flush() == ""


def test_invalid_bytes_are_replaced_at_flush():
    stream = Utf8Decoder()
    assert stream.feed(b"a\xe2\x82") == "a"
    assert stream.flush() == "\ufffd"


def test_stop_string_is_held_back_then_cut():
    m = StopMatcher(("</end>",))
    assert m.feed("Hello <") == ("Hello ", False)
    assert m.feed("/en") == ("", False)
    assert m.feed("d> tail") == ("", True)


def test_held_text_is_released_when_it_cannot_match():
    m = StopMatcher(("STOP",))
    assert m.feed("ST") == ("", False)
    assert m.feed("ART") == ("START", False)
    assert m.feed("x ST") == ("x ", False)
    assert m.flush() == "ST"


def test_no_stops_passes_through():
    assert StopMatcher(()).feed("abc") == ("abc", False)


def test_the_stop_string_that_cut_is_named():
    m = StopMatcher(("END", "5"))
    assert m.matched is None
    assert m.feed("1, 2, 3, 4, ") == ("1, 2, 3, 4, ", False)
    assert m.feed("5, 6 END") == ("", True)
    # The earliest hit in the text wins, not the first stop listed.
    assert m.matched == "5"
