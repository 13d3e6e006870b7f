import pytest

from llmctl.errors import InvalidParams
from llmctl.runtime.sampling import SamplingParams


@pytest.mark.parametrize("kwargs,param", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": 1.5}, "top_k"),
    ({"seed": True}, "seed"),
    ({"stop": ["ok", ""]}, "stop"),
])
def test_invalid_values_name_the_parameter(kwargs, param):
    with pytest.raises(InvalidParams) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param


def test_stop_string_becomes_tuple_and_replace_keeps_validation():
    p = SamplingParams(stop="\n")
    assert p.stop == ("\n",)
    assert p.replace(temperature=0).greedy
    with pytest.raises(InvalidParams):
        p.replace(temperature=-1)
