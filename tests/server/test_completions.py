"""Completions and chat completions through the official openai client: greedy output equals
`specdec generate`, streaming equals non-streaming, stop sequences, seeded replay, usage, the
vLLM / llama-server extensions, tokenize / detokenize, models, the specdec object."""
from __future__ import annotations

import json

import pytest

from conftest import TINY, assert_error, generate

PROMPT = "Once upon a time"


def completion_ids(client, **kw):
    """A non-streamed completion with the token ids (return_token_ids)."""
    extra = {"return_token_ids": True, **kw.pop("extra_body", {})}
    return client.completions.create(model=kw.pop("model", "stories260K"), extra_body=extra, **kw)


def stream_text(stream):
    """Text, finish reasons by choice index, and the last chunk of a streamed completion."""
    text, finish, chunks = {}, {}, []
    for chunk in stream:
        chunks.append(chunk)
        for c in chunk.choices:
            piece = c.text if hasattr(c, "text") and c.text is not None else (
                c.delta.content if hasattr(c, "delta") and c.delta.content else "")
            text[c.index] = text.get(c.index, "") + (piece or "")
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    return text, finish, chunks


def test_models_lists_the_served_model(tiny):
    models = tiny.client().models.list()
    assert [m.id for m in models.data] == ["stories260K"]
    assert models.data[0].object == "model"
    one = tiny.client().models.retrieve("stories260K")
    assert one.id == "stories260K"


def test_greedy_completion_equals_generate(tiny):
    ref = generate(["-m", str(TINY), "-p", PROMPT, "-n", "48"])
    r = completion_ids(tiny.client(), prompt=PROMPT, max_tokens=48, temperature=0)
    choice = r.choices[0]
    assert choice.text == ref["text"]
    assert choice.model_extra["token_ids"] == ref["tokens"]
    assert choice.model_extra["prompt_token_ids"] == ref["prompt_tokens"]
    assert choice.finish_reason == ref["finish_reason"] == "length"
    assert r.usage.prompt_tokens == len(ref["prompt_tokens"])
    assert r.usage.completion_tokens == 48
    assert r.usage.total_tokens == r.usage.prompt_tokens + 48
    assert r.model == "stories260K" and r.object == "text_completion"
    assert r.model_extra["specdec"]["method"] == "none"
    assert r.model_extra["specdec"]["target_passes"] == 47  # the first token comes from the prompt


def test_greedy_with_draft_model_equals_generate_and_reports_speculation(tiny_draft):
    ref = generate(["-m", str(TINY), "-p", PROMPT, "-n", "64"])
    r = completion_ids(tiny_draft.client(), prompt=PROMPT, max_tokens=64, temperature=0)
    assert r.choices[0].text == ref["text"]
    assert r.choices[0].model_extra["token_ids"] == ref["tokens"]
    spec = r.model_extra["specdec"]
    assert spec["method"] == "draft"
    assert spec["drafted_tokens"] > 0 and 0 < spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["target_passes"] < 63  # fewer passes than tokens: drafts were accepted
    m = tiny_draft.metrics()
    assert m['specdec_spec_decode_num_draft_tokens_total{method="draft"}'] >= spec["drafted_tokens"]
    assert m['specdec_spec_decode_num_accepted_tokens_total{method="draft"}'] >= spec[
        "accepted_tokens"]
    per_pos_name = 'specdec_spec_decode_num_accepted_tokens_per_pos_total{method="draft"'
    per_pos = sum(v for k, v in m.items() if k.startswith(per_pos_name))
    assert per_pos == m['specdec_spec_decode_num_accepted_tokens_total{method="draft"}']


def test_streaming_equals_non_streaming_and_reports_usage(tiny):
    client = tiny.client()
    full = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=40,
                                     temperature=0)
    stream = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=40,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    text, finish, chunks = stream_text(stream)
    assert text[0] == full.choices[0].text
    assert finish == {0: "length"}
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert last.usage.completion_tokens == full.usage.completion_tokens == 40
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_chat_greedy_equals_generate_chat(smol):
    question = "What is the capital of France?"
    ref = generate(["--chat", "-p", question, "-n", "24"])
    client = smol.client()
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", temperature=0,
                                       max_completion_tokens=24,
                                       messages=[{"role": "user", "content": question}],
                                       extra_body={"return_token_ids": True})
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert msg.content == ref["text"]
    assert r.choices[0].model_extra["token_ids"] == ref["tokens"]
    assert r.model_extra["prompt_token_ids"] == ref["prompt_tokens"]
    assert r.choices[0].finish_reason == ref["finish_reason"]
    assert r.object == "chat.completion"
    assert r.usage.prompt_tokens == len(ref["prompt_tokens"])
    assert r.usage.completion_tokens == len(ref["tokens"])
    assert r.model_extra["specdec"]["method"] == "ngram"

    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", temperature=0,
                                            max_tokens=24, stream=True,
                                            messages=[{"role": "user", "content": question}],
                                            stream_options={"include_usage": True})
    text, finish, chunks = stream_text(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text[0] == ref["text"]
    assert finish[0] == ref["finish_reason"]
    assert chunks[-1].usage.completion_tokens == len(ref["tokens"])
    assert chunks[-1].object == "chat.completion.chunk"


def test_chat_content_parts_and_system_message(smol):
    client = smol.client()
    a = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": [{"type": "text", "text": "Say "},
                                               {"type": "text", "text": "hello."}]}])
    b = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", temperature=0, max_tokens=8,
        messages=[{"role": "developer", "content": "Answer briefly."},
                  {"role": "user", "content": "Say hello."}])
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stop_strings_cut_the_text_streamed_or_not(tiny):
    client = tiny.client()
    ref = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=60,
                                    temperature=0).choices[0].text
    stop = "Lily"
    assert stop in ref
    expected = ref[:ref.index(stop)]
    for stops in (stop, [stop, "zzz-never"]):
        r = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=60,
                                      temperature=0, stop=stops)
        assert r.choices[0].text == expected
        assert r.choices[0].finish_reason == "stop"
        text, finish, _ = stream_text(client.completions.create(
            model="stories260K", prompt=PROMPT, max_tokens=60, temperature=0, stop=stops,
            stream=True))
        assert text[0] == expected and finish[0] == "stop"


def test_seeded_sampling_replays(tiny):
    client = tiny.client()

    def sample(seed, stream=False, **kw):
        args = dict(model="stories260K", prompt=PROMPT, max_tokens=40, temperature=1.0,
                    seed=seed, **kw)
        if stream:
            return stream_text(client.completions.create(stream=True, **args))[0][0]
        return client.completions.create(**args).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert sample(1234, stream=True) == first
    topk = {"top_k": 40}
    assert sample(1234, top_p=0.9, extra_body=topk) == sample(1234, top_p=0.9, extra_body=topk)
    assert sample(1234, extra_body={"min_p": 0.05}) == sample(1234, extra_body={"min_p": 0.05})
    others = {sample(s) for s in (1, 2, 3)}
    assert len(others | {first}) > 1  # different seeds, different samples
    # The same draws as `specdec generate` with that seed.
    ref = generate(["-m", str(TINY), "-p", PROMPT, "-n", "40", "--temp", "1.0", "--seed", "1234"])
    assert first == ref["text"]


def test_n_choices_and_batched_prompts(tiny):
    client = tiny.client()
    r = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=20,
                                  temperature=1.0, seed=7, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    single = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=20,
                                       temperature=1.0, seed=7)
    assert r.choices[0].text == single.choices[0].text
    assert r.usage.completion_tokens == 60
    assert r.usage.prompt_tokens == single.usage.prompt_tokens

    prompts = [PROMPT, "The little dog"]
    batch = client.completions.create(model="stories260K", prompt=prompts, max_tokens=12,
                                      temperature=0)
    for i, p in enumerate(prompts):
        solo = client.completions.create(model="stories260K", prompt=p, max_tokens=12,
                                         temperature=0)
        assert batch.choices[i].text == solo.choices[0].text

    text, finish, _ = stream_text(client.completions.create(
        model="stories260K", prompt=PROMPT, max_tokens=10, temperature=0, n=2, stream=True))
    assert set(text) == {0, 1} and text[0] == text[1]
    assert finish == {0: "length", 1: "length"}


def test_prompt_as_token_ids_echo_and_usage(tiny):
    client = tiny.client()
    ids = tiny.post_json("/tokenize", {"content": PROMPT, "add_special": True})[2]["tokens"]
    a = completion_ids(client, prompt=PROMPT, max_tokens=16, temperature=0)
    b = completion_ids(client, prompt=ids, max_tokens=16, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids) == b.usage.prompt_tokens
    assert a.choices[0].model_extra["prompt_token_ids"] == ids
    echo = client.completions.create(model="stories260K", prompt=PROMPT, max_tokens=16,
                                     temperature=0, echo=True)
    assert echo.choices[0].text == PROMPT + a.choices[0].text


def test_stop_token_ids_and_ignore_eos(tiny):
    client = tiny.client()
    ref = completion_ids(client, prompt=PROMPT, max_tokens=30, temperature=0).choices[0]
    ids = ref.model_extra["token_ids"]
    stop_id = ids[10]
    first = ids.index(stop_id)
    r = completion_ids(client, prompt=PROMPT, max_tokens=30, temperature=0,
                       extra_body={"stop_token_ids": [stop_id]}).choices[0]
    assert r.finish_reason == "stop"
    assert r.model_extra["token_ids"] == ids[:first + 1]
    # ignore_eos: runs to max_tokens even past the end-of-sequence token.
    long = completion_ids(client, prompt=PROMPT, max_tokens=300, temperature=0,
                          extra_body={"ignore_eos": True}).choices[0]
    assert long.finish_reason == "length" and len(long.model_extra["token_ids"]) == 300


def test_default_max_tokens_runs_to_the_context_end(tiny):
    # Chat on the tiny model (no template: ChatML text) without max_tokens: until EOS or the
    # 512-token context.
    r = tiny.client().chat.completions.create(
        model="stories260K", temperature=0, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 512


def test_tokenize_detokenize_round_trip(tiny):
    text = "Hello world, once upon a time."
    status, _, tok = tiny.post_json("/tokenize", {"content": text})
    assert status == 200 and all(isinstance(t, int) for t in tok["tokens"])
    status, _, detok = tiny.post_json("/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and detok["content"] == text
    _, _, pieces = tiny.post_json("/tokenize", {"content": "Hi", "with_pieces": True})
    assert all(set(p) == {"id", "piece"} for p in pieces["tokens"])
    with_bos = tiny.post_json("/tokenize", {"content": text, "add_special": True})[2]["tokens"]
    assert with_bos == [1] + tok["tokens"]
    # A byte token alone is half a character: replaced, never invalid JSON.
    status, _, half = tiny.post_json("/detokenize", {"tokens": [3 + 0xE2]})
    assert status == 200 and half["content"] == "\ufffd"


def test_health_and_metrics_names(tiny):
    status, _, body = tiny.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    tiny.client().completions.create(model="stories260K", prompt=PROMPT, max_tokens=4)
    m = tiny.metrics()
    for name in ["specdec_requests_running", "specdec_requests_waiting", "specdec_kv_blocks_used",
                 "specdec_kv_blocks_cached", "specdec_kv_blocks_total",
                 "specdec_prompt_tokens_total", "specdec_generation_tokens_total",
                 "specdec_prefix_cache_hits_total", "specdec_prefix_cache_queries_total",
                 "specdec_time_to_first_token_seconds_count",
                 "specdec_inter_token_latency_seconds_count",
                 "specdec_e2e_request_latency_seconds_count",
                 'specdec_spec_decode_target_passes_total{method="none"}']:
        assert name in m, name
    assert m["specdec_kv_blocks_total"] > 0
    assert m["specdec_generation_tokens_total"] >= 4
    assert m['specdec_e2e_request_latency_seconds_bucket{le="+Inf"}'] == m[
        "specdec_e2e_request_latency_seconds_count"]


@pytest.mark.parametrize("path", ["/v1/completions", "/completions"])
def test_routes_without_v1_prefix(tiny, path):
    status, _, body = tiny.post_json(path, {"prompt": PROMPT, "max_tokens": 3})
    assert status == 200 and body["usage"]["completion_tokens"] == 3
