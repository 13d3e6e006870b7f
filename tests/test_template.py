import pytest

from llmctl.errors import InvalidParams, TemplateError
from llmctl.runtime.formats.template import ChatTemplate, normalize_messages

MSGS = [{"role": "user", "content": "hi"}]


def test_chatml_fallback_when_gguf_has_no_template():
    text = ChatTemplate(None).render(MSGS)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_bos_and_generation_prompt_variables():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}"
                     "{% if add_generation_prompt %}>{% endif %}", bos_token="<s>")
    assert t.render(MSGS) == "<s>[hi]>"


@pytest.mark.parametrize("payload", [
    # The CVE-2024-34359 shape: reach os through Python internals.
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ self.__init__.__globals__['os'].system('touch /tmp/llmctl-pwned') }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
])
def test_template_cannot_escape_sandbox(payload, tmp_path):
    with pytest.raises(TemplateError):
        ChatTemplate(payload).render(MSGS)


def test_list_mutation_is_refused():
    with pytest.raises(TemplateError):
        ChatTemplate("{% set x = [] %}{{ x.append(1) }}").render(MSGS)


def test_raise_exception_gives_clear_error():
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.render(MSGS)


def test_invalid_template_syntax():
    with pytest.raises(TemplateError, match="invalid chat template"):
        ChatTemplate("{% for %}")


def test_normalize_messages_flattens_text_parts_and_rejects_garbage():
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert normalize_messages(parts) == [{"role": "user", "content": "ab"}]
    for bad in ([], "hi", [{"content": "x"}], [{"role": "user", "content": 5}]):
        with pytest.raises(InvalidParams):
            normalize_messages(bad)


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": [{"type": "text", "text": None}]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    [{"role": "user", "content": ["text"]}],
    [{"role": "user", "content": {"type": "text", "text": "hi"}}],
    [{"role": None, "content": "x"}],
    [{"role": "", "content": "x"}],
    [["user", "x"]],
    [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function"}]}],
])
def test_every_message_shape_error_is_invalid_params(messages):
    with pytest.raises(InvalidParams) as e:
        normalize_messages(messages)
    assert e.value.param == "messages" and "messages[0]" in e.value.message


def test_empty_content_and_extra_keys_are_accepted():
    msgs = [{"role": "system", "content": "", "name": "x"}, {"role": "user", "content": []}]
    assert normalize_messages(msgs) == [{"role": "system", "content": ""},
                                        {"role": "user", "content": ""}]
    # OpenAI requires content except on an assistant message with tool_calls.
    with pytest.raises(InvalidParams, match=r"messages\[0\]\.content is required"):
        normalize_messages([{"role": "system", "content": None}])


def test_tojson_is_transformers_filter_not_jinjas():
    # Jinja's own filter would sort the keys and write < as \u003c: not the
    # text the model saw in training.
    t = ChatTemplate("{{ {'b': \"<é&'>\", 'a': 1} | tojson }}|{{ [1] | tojson(indent=2) }}")
    assert t.render(MSGS) == '{"b": "<é&\'>", "a": 1}|[\n  1\n]'


# Small templates of each way a template thinks.
_TURNS = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
SWITCH = (_TURNS + "{% if add_generation_prompt %}<|assistant|>"
          "{% if enable_thinking is defined and enable_thinking is false %}"
          "<think>\n\n</think>\n\n{% endif %}{% endif %}")
OPENS = _TURNS + "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
TAGS = ("{% for m in messages %}<|{{ m.role }}|>"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.mark.parametrize("source, kind", [
    (SWITCH, "switch"), (OPENS, "opens"), (TAGS, "tags"), (None, None),
    ("{{ raise_exception('no') }}", None),
])
def test_how_a_template_thinks(source, kind):
    assert ChatTemplate(source).thinking == kind


def test_a_switch_template_gets_enable_thinking():
    t = ChatTemplate(SWITCH)
    on = "<|user|>hi\n<|assistant|>"
    assert t.render(MSGS) == t.render(MSGS, thinking=True) == on
    assert t.render(MSGS, thinking=False) == on + "<think>\n\n</think>\n\n"


def test_an_opened_thought_is_closed_when_thinking_is_off():
    t = ChatTemplate(OPENS)
    assert t.render(MSGS, thinking=True) == "<|user|>hi\n<|assistant|><think>\n"
    # What Qwen3's template writes for enable_thinking=false.
    assert t.render(MSGS, thinking=False) == "<|user|>hi\n<|assistant|><think>\n\n</think>\n\n"
    assert t.render(MSGS, add_generation_prompt=False, thinking=False) == "<|user|>hi\n"


def test_thinking_off_on_a_tags_template_writes_the_empty_thought():
    t = ChatTemplate(TAGS)
    assert t.render(MSGS, thinking=False) == "<|user|>hi\n<|assistant|><think>\n\n</think>\n\n"
    # A template that does not think is left as it is.
    assert ChatTemplate(None).render(MSGS, thinking=False) == ChatTemplate(None).render(MSGS)


def test_past_reasoning_reaches_a_template_that_reads_it():
    msgs = normalize_messages([{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
                               {"role": "user", "content": "ok"}])
    assert msgs[1]["reasoning_content"] == "2+2"
    assert ChatTemplate(TAGS).reads_reasoning
    assert "<think>2+2</think>4" in ChatTemplate(TAGS).render(msgs)
    assert not ChatTemplate(None).reads_reasoning and "2+2" not in ChatTemplate(None).render(msgs)
    with pytest.raises(InvalidParams, match=r"messages\[0\]\.reasoning_content"):
        normalize_messages([{"role": "assistant", "content": "", "reasoning_content": 5}])
