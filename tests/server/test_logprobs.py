"""Logprobs through the official openai client (its typed objects), streamed and not, for
completions and chat; n-gram speculation gives the same logprobs as plain decoding; refused
values; the per-method speculation metrics; vLLM's stop_reason."""
from __future__ import annotations

import math

import openai
import pytest

from conftest import assert_error

PROMPT = "Once upon a time"
TINY_MODEL = "stories260K"
SMOL_MODEL = "SmolLM2-135M-Instruct.Q4_1"


def assert_sorted_logprobs(values):
    assert all(v <= 0 for v in values), values
    assert values == sorted(values, reverse=True), values
    assert sum(math.exp(v) for v in values) <= 1 + 1e-4


def stream_completion_logprobs(stream):
    """Text, finish reason, stop_reason and the concatenated logprobs of choice 0 of a stream."""
    text, finish, stop_reason = "", None, "unset"
    tokens, token_logprobs, top, offsets = [], [], [], []
    for chunk in stream:
        for c in chunk.choices:
            assert c.index == 0
            text += c.text
            if c.logprobs is not None:
                lp = c.logprobs
                assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(
                    lp.text_offset)
                tokens += lp.tokens
                token_logprobs += lp.token_logprobs
                top += lp.top_logprobs
                offsets += lp.text_offset
            if c.finish_reason is not None:
                finish = c.finish_reason
                stop_reason = c.model_extra["stop_reason"]
    return text, finish, stop_reason, (tokens, token_logprobs, top, offsets)


def test_completion_logprobs_greedy(tiny):
    client = tiny.client()
    r = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=32, temperature=0,
                                  logprobs=5, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    lp = choice.logprobs
    assert isinstance(lp, openai.types.completion_choice.Logprobs)
    n = r.usage.completion_tokens
    assert n == 32 == len(choice.model_extra["token_ids"])
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(
        lp.text_offset) == n
    # The token strings are the pieces of the text, the offsets where each starts.
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(n)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert isinstance(top, dict) and 2 <= len(top) <= 5
        assert next(iter(top)) == token  # greedy: the chosen token is the best
        assert top[token] == logprob
        assert_sorted_logprobs(list(top.values()))
    assert choice.model_extra["stop_reason"] is None  # finish_reason "length"

    # logprobs=0: the chosen token's logprob alone.
    zero = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=8,
                                     temperature=0, logprobs=0).choices[0].logprobs
    assert zero.tokens == lp.tokens[:8] and zero.token_logprobs == lp.token_logprobs[:8]
    assert zero.top_logprobs == [{t: v} for t, v in zip(zero.tokens, zero.token_logprobs)]

    # Without logprobs: null.
    plain = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=4,
                                      temperature=0)
    assert plain.choices[0].logprobs is None

    # Streamed: the chunks' logprobs together are the same.
    text, finish, _, streamed = stream_completion_logprobs(client.completions.create(
        model=TINY_MODEL, prompt=PROMPT, max_tokens=32, temperature=0, logprobs=5, stream=True))
    assert text == choice.text and finish == "length"
    assert streamed == (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset)


def test_completion_logprobs_sampled_include_the_chosen_token(tiny):
    r = tiny.client().completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=40,
                                         temperature=2.0, seed=5, logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens == 40
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # The best token, and the chosen one when another (OpenAI: up to logprobs + 1).
        assert 1 <= len(top) <= 2 and top[token] == logprob
        assert_sorted_logprobs(list(top.values()))


def check_chat_logprobs(content, top_n):
    for entry in content:
        assert isinstance(entry, openai.types.chat.ChatCompletionTokenLogprob)
        assert entry.logprob <= 0 and isinstance(entry.bytes, list)
        raw = bytes(entry.bytes)
        try:
            assert entry.token == raw.decode("utf-8")
        except UnicodeDecodeError:  # half a character: replaced in the string, raw in bytes
            assert "\ufffd" in entry.token
        assert len(entry.top_logprobs) == top_n
        if top_n:
            # Greedy: the chosen token is the best.
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == entry.logprob
            assert entry.top_logprobs[0].bytes == entry.bytes
            assert_sorted_logprobs([t.logprob for t in entry.top_logprobs])


def test_chat_logprobs_streamed_and_not(smol):
    client = smol.client()
    args = dict(model=SMOL_MODEL, temperature=0, max_tokens=96, logprobs=True, top_logprobs=3,
                messages=[{"role": "user", "content": "Say hello in French, with an emoji."}])
    r = client.chat.completions.create(**args, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert isinstance(choice.logprobs, openai.types.chat.chat_completion.ChoiceLogprobs)
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens == len(choice.model_extra["token_ids"])
    check_chat_logprobs(content, 3)
    # The raw bytes of the tokens are the text (the end-of-turn token aside).
    # It ends at the model's end of turn: stop_reason null (vLLM), the token has its logprob.
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] is None
    assert content[-1].token == "<|im_end|>"
    assert b"".join(bytes(e.bytes) for e in content[:-1]) == choice.message.content.encode()

    streamed, text, finish, stop_reason = [], "", None, "unset"
    for chunk in client.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.logprobs is not None:
                streamed += c.logprobs.content
            if c.finish_reason is not None:
                finish, stop_reason = c.finish_reason, c.model_extra["stop_reason"]
    assert text == choice.message.content and finish == choice.finish_reason
    assert stop_reason == choice.model_extra["stop_reason"]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]

    # logprobs without top_logprobs: the chosen tokens only.
    only = client.chat.completions.create(**{**args, "max_tokens": 8, "top_logprobs": None})
    assert [e.token for e in only.choices[0].logprobs.content] == [e.token for e in content[:8]]
    check_chat_logprobs(only.choices[0].logprobs.content, 0)
    off = client.chat.completions.create(**{**args, "max_tokens": 4, "logprobs": None,
                                            "top_logprobs": None})
    assert off.choices[0].logprobs is None


def test_chat_logprobs_of_tokens_that_split_a_character(smol):
    # SmolLM2 writes Japanese in byte-level tokens of half a character each.
    r = smol.client().chat.completions.create(
        model=SMOL_MODEL, temperature=0, max_tokens=24, logprobs=True, top_logprobs=2,
        messages=[{"role": "user", "content": "Translate cat into Japanese."}])
    content = r.choices[0].logprobs.content
    check_chat_logprobs(content, 2)
    partial = [e for e in content if e.token == "\ufffd"]
    assert partial, [e.token for e in content]
    for e in partial:
        with pytest.raises(UnicodeDecodeError):
            bytes(e.bytes).decode("utf-8")
    joined = b"".join(bytes(e.bytes) for e in content)
    assert joined.decode("utf-8", errors="replace") == r.choices[0].message.content


def test_ngram_speculation_gives_the_same_logprobs(tiny, tiny_ngram):
    # A prompt that holds its own continuation: the n-gram drafts get accepted.
    ref = tiny.client().completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=60,
                                           temperature=0).choices[0].text
    prompt = PROMPT + ref + "\n\n" + PROMPT
    args = dict(model=TINY_MODEL, prompt=prompt, max_tokens=60, temperature=0, logprobs=5)
    plain = tiny.client().completions.create(**args)
    spec = tiny_ngram.client().completions.create(**args)
    assert plain.model_extra["specdec"]["method"] == "none"
    assert spec.model_extra["specdec"]["method"] == "ngram"
    assert spec.model_extra["specdec"]["accepted_tokens"] > 0
    assert spec.choices[0].text == plain.choices[0].text
    # Equal as serialized (the same float32 values).
    assert spec.choices[0].logprobs.model_dump() == plain.choices[0].logprobs.model_dump()
    _, _, _, streamed = stream_completion_logprobs(
        tiny_ngram.client().completions.create(**args, stream=True))
    lp = plain.choices[0].logprobs
    assert streamed == (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset)

    chat = dict(model=TINY_MODEL, temperature=0, max_tokens=40, logprobs=True, top_logprobs=4,
                messages=[{"role": "user", "content": prompt}])
    a = tiny.client().chat.completions.create(**chat).choices[0].logprobs.model_dump()
    b = tiny_ngram.client().chat.completions.create(**chat).choices[0].logprobs.model_dump()
    assert a == b


def test_speculation_metrics_per_method_and_position(tiny, tiny_ngram):
    ref = tiny.client().completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=60,
                                           temperature=0).choices[0].text
    r = tiny_ngram.client().completions.create(model=TINY_MODEL, prompt=PROMPT + ref + "\n\n" +
                                               PROMPT, max_tokens=60, temperature=0)
    spec = r.model_extra["specdec"]
    assert spec["accepted_tokens"] > 0
    m = tiny_ngram.metrics()
    label = '{method="ngram"}'
    drafted = m["specdec_spec_decode_num_draft_tokens_total" + label]
    accepted = m["specdec_spec_decode_num_accepted_tokens_total" + label]
    drafts = m["specdec_spec_decode_num_drafts_total" + label]
    passes = m["specdec_spec_decode_target_passes_total" + label]
    assert drafted >= spec["drafted_tokens"] and accepted >= spec["accepted_tokens"]
    assert 0 < accepted <= drafted and 0 < drafts <= passes
    per_pos = {}
    prefix = 'specdec_spec_decode_num_accepted_tokens_per_pos_total{method="ngram",position="'
    for name, value in m.items():
        if name.startswith(prefix):
            per_pos[int(name[len(prefix):-2])] = value
    assert sorted(per_pos) == list(range(len(per_pos))) and len(per_pos) >= 1
    assert sum(per_pos.values()) == accepted
    assert per_pos[0] > 0 and per_pos[0] <= drafts
    # A draft accepted at depth k + 1 was accepted at depth k: non-increasing by position
    # (the last position also counts the deeper ones).
    values = [per_pos[k] for k in sorted(per_pos)][:-1]
    assert values == sorted(values, reverse=True)
    # No other method counted anything on this server.
    assert not any('method="draft"' in name for name in m)


def test_stop_reason_of_stop_strings_and_stop_token_ids(tiny):
    client = tiny.client()
    ref = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                    extra_body={"return_token_ids": True}).choices[0]
    assert ref.finish_reason == "length" and ref.model_extra["stop_reason"] is None

    r = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                  stop=["zzz", "Lily"], logprobs=1).choices[0]
    assert r.finish_reason == "stop" and r.model_extra["stop_reason"] == "Lily"
    assert "Lily" not in r.text
    # The token that completed the stop string has its logprob too (one per token sent).
    assert "".join(r.logprobs.tokens).startswith(r.text) and "Lily" in "".join(r.logprobs.tokens)
    text, finish, stop_reason, _ = stream_completion_logprobs(client.completions.create(
        model=TINY_MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop="Lily", stream=True))
    assert (text, finish, stop_reason) == (r.text, "stop", "Lily")

    stop_id = ref.model_extra["token_ids"][6]
    r = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                  extra_body={"stop_token_ids": [stop_id]}).choices[0]
    assert r.finish_reason == "stop" and r.model_extra["stop_reason"] == stop_id
    assert isinstance(r.model_extra["stop_reason"], int)


def test_logprobs_errors_through_the_openai_client(tiny):
    client = tiny.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TINY_MODEL, prompt="x", logprobs=21)
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TINY_MODEL, prompt="x", logprobs=-1)
    assert e.value.body["param"] == "logprobs"
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=TINY_MODEL, messages=msgs, top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=TINY_MODEL, messages=msgs, logprobs=True,
                                       top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"
    # The engine's refusals name their field and code (SubmitResult), not matched from text.
    status, _, body = tiny.post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "word " * 700}], "logprobs": True})
    assert_error(status, body, 400, "messages", "context_length_exceeded")
    status, _, body = tiny.post_json("/v1/completions", {"prompt": "x",
                                                         "stop_token_ids": [0, 9999]})
    assert_error(status, body, 400, "stop_token_ids", None)
