"""RequestSchema (tracedpush/testing/fuzz.py) is built per model and vocabulary.

The real-engine fuzz relies on two things the stub fuzz cannot show: the oracle follows
the given vocabulary and model name, and a capped schema never sends an engine a body
without a small token limit (chat's default is the rest of the context).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tracedpush.testing.fuzz import CHAT, COMPLETIONS, Case, RequestSchema, as_sent

SMALL = RequestSchema("tiny-qwen2", 512, max_tokens=8)


def test_the_oracle_follows_the_vocabulary_and_the_model() -> None:
    assert SMALL.refuses(COMPLETIONS, {"model": "tiny-qwen2", "prompt": [511]}) is None
    assert SMALL.refuses(COMPLETIONS, {"model": "tiny-qwen2", "prompt": [512]}) == "prompt"
    assert SMALL.refuses(COMPLETIONS, {"model": "stub-model", "prompt": "x"}) == "model"
    wide = RequestSchema("stub-model", 1000)
    assert wide.refuses(COMPLETIONS, {"model": "stub-model", "prompt": [512]}) is None
    bias = {"model": "tiny-qwen2", "prompt": "x", "logit_bias": {"512": 1}}
    assert SMALL.refuses(COMPLETIONS, bias) == "logit_bias"


@settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=SMALL.cases(modes=("pull",)))
def test_a_capped_schema_keeps_accepted_bodies_cheap(case: Case) -> None:
    assert case.mode == "pull"
    body = as_sent(case.raw)
    if SMALL.refuses(case.route, body) is not None:
        return
    # the limit vLLM applies is an integer: 1-8 drawn, or a near miss (16, 81, 2**63-1...)
    keys = ("max_completion_tokens", "max_tokens") if case.route == CHAT else ("max_tokens",)
    limit = next((body[k] for k in keys if body.get(k) is not None), None)
    assert type(limit) is int, body
