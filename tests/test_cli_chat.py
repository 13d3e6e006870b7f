"""chat's slash commands over a conversation, without a model: they only
touch the session's state (answers are covered end to end in test_cli.py)."""

from llmctl.cli.chat import HELP, describe_stats, slash
from llmctl.runtime.chat_session import ChatSession, TurnStats
from llmctl.runtime.engine.events import FinishEvent, Usage


def _session() -> ChatSession:
    s = ChatSession(llm=None, params=None, system="Be kind.")
    s.history += [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    return s


def test_clear_keeps_the_system_prompt():
    s = _session()
    assert slash(s, "/clear") == ("Conversation cleared.", False)
    assert s.messages() == [{"role": "system", "content": "Be kind."}]


def test_system_replaces_or_removes_the_prompt_and_starts_over():
    s = _session()
    assert slash(s, "/system  Answer in French. ") == ("System prompt set.", False)
    assert s.messages() == [{"role": "system", "content": "Answer in French."}]
    assert slash(s, "/system") == ("System prompt removed.", False)
    assert s.messages() == []


def test_stats_describe_the_last_answer():
    last = TurnStats.from_finish(FinishEvent("stop", Usage(87, 30, 72), ttft_s=0.0624,
                                             duration_s=0.3, decode_s=0.25))
    assert describe_stats(last) == \
        "prompt 87 tok (72 cached), generated 30 tok, TTFT 0.062s, 116.0 tok/s"


def test_help_bye_and_unknown():
    s = _session()
    assert slash(s, "/help") == (HELP, False) and "/stats" in HELP
    for leave in ("/bye", "/exit", "/quit"):
        assert slash(s, leave) == ("", True)
    assert slash(s, "/nope x") == ("Unknown command /nope; try /help.", False)
    assert len(s.history) == 2
