"""The vLLM backend's contract as spanmill speaks it: the request body, and answers gathered
from the backend's responses (no services; served: tests/gateway/test_gateway_vllm.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spanmill.gateway.upstream import _classify
from spanmill.serving import vllm
from spanmill.serving.protocol import GenerationParams, ProtocolError


class Words:
    """A tokenizer with one id per word, to see where ids came from."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [len(word) for word in text.split()]}


def test_the_body_asks_for_the_sampled_tokens_and_names_the_adapter() -> None:
    params = GenerationParams(temperature=0.7, top_p=0.9, max_tokens=12, n=2, seed=5,
                              stop=("\n",))  # fmt: skip
    body = vllm.generate_body("<prompt>", params, "calc-v3", stream=True)
    assert body["text_input"] == "<prompt>" and body["stream"] is True
    assert body["exclude_input_in_output"] is True
    assert all(body[name] for name in ("return_finish_reason", "return_logprobs",
                                       "return_num_input_tokens"))  # fmt: skip
    sampling = json.loads(body["sampling_parameters"])
    assert sampling == {"n": 2, "temperature": 0.7, "top_p": 0.9, "max_tokens": 12,
                        "logprobs": 0, "seed": 5, "stop": ["\n"],
                        "lora_name": "calc-v3"}  # fmt: skip
    base = json.loads(vllm.generate_body("p", GenerationParams(), None, stream=False)
                      ["sampling_parameters"])  # fmt: skip
    assert "lora_name" not in base and "seed" not in base


def logprobs(*tokens: tuple[int, float]) -> str:
    return json.dumps([{str(t): {"logprob": lp, "rank": 1, "decoded_token": "x"}}
                       for t, lp in tokens])  # fmt: skip


def test_streamed_responses_make_one_answer_with_the_sampled_ids() -> None:
    answer = vllm.Answer(2, [1, 2, 3], Words())
    events: list[dict[str, Any]] = [
        {"text_output": ["He", "No"], "finish_reason": ["None", "None"],
         "logprobs": [logprobs((7, -0.5)), logprobs((9, -0.1))], "num_input_tokens": 3},
        {"text_output": ["llo", ""], "finish_reason": ["length", "stop"],
         "logprobs": [logprobs((8, -1.0)), "[]"], "num_input_tokens": 3},
    ]  # fmt: skip
    assert [answer.add(e) for e in events] == [["He", "No"], ["llo", ""]]
    result = answer.result("3")
    assert [c.text for c in result.choices] == ["Hello", "No"]
    assert [c.token_ids for c in result.choices] == [[7, 8], [9]]
    assert [c.logprobs for c in result.choices] == [[-0.5, -1.0], [-0.1]]
    assert [c.finish_reason for c in result.choices] == ["length", "stop"]
    assert result.prompt_token_ids == [1, 2, 3] and result.model_version == "3"
    assert result.extra["token_ids"] == vllm.TOKEN_IDS_SAMPLED


@pytest.mark.parametrize(
    "event",
    [
        # A backend that gave no logprobs: the text is tokenised again, and says so.
        {"text_output": "three short words", "finish_reason": "stop", "logprobs": "null"},
        {"text_output": "three short words", "finish_reason": "stop"},
    ],
)
def test_an_answer_without_sampled_ids_is_retokenised_and_marked(event: dict[str, Any]) -> None:
    answer = vllm.Answer(1, [1], Words())
    answer.add(event)
    result = answer.result()
    assert result.choices[0].token_ids == [5, 5, 5] and result.choices[0].logprobs == []
    assert result.extra["token_ids"] == vllm.TOKEN_IDS_RETOKENIZED


def test_a_prompt_counted_otherwise_by_the_backend_is_marked() -> None:
    answer = vllm.Answer(1, [1, 2], Words())
    answer.add({"text_output": "a", "finish_reason": "stop", "logprobs": logprobs((4, -0.2)),
                "num_input_tokens": 3})  # fmt: skip
    assert answer.result().extra["token_ids"] == vllm.TOKEN_IDS_RETOKENIZED


def test_out_of_contract_responses_are_refused() -> None:
    with pytest.raises(ProtocolError, match="without text_output"):
        vllm.Answer(1, [], Words()).add({"finish_reason": "stop"})
    with pytest.raises(ProtocolError, match="2 texts for 1 choices"):
        vllm.Answer(1, [], Words()).add({"text_output": ["a", "b"]})


def test_vllm_errors_are_answered_as_the_python_flavours_are() -> None:
    long = _classify("Error generating stream: The decoder prompt (length 9000) is longer than "
                     "the maximum model length of 4096.", "calc", "3")  # fmt: skip
    assert (long.status, long.code) == (400, "context_length_exceeded")
    lacking = _classify("LoRA calc-v9 is not supported, we currently support ['calc-v3']",
                        "calc", "9")  # fmt: skip
    assert lacking.status == 503 and lacking.missing  # another replica may list it
