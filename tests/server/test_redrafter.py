"""ReDrafter through the server and the CLI: `specdec serve --spec redrafter` finds the head that
ships in heads/ for the default model, answers greedy chat requests exactly as plain
`specdec generate --chat` does, reports the method and its drafts, and exports per-method
metrics; asking for a ReDrafter head for a model that has none is a clear error at start."""
import subprocess

import pytest

from conftest import BINARY, DEFAULT_MODEL, TINY, generate

MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def smol_redrafter(start_server):
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"{DEFAULT_MODEL} is missing: run scripts/setup.sh")
    return start_server(["--spec", "redrafter"])


def test_chat_greedy_with_the_shipped_head_equals_plain_generate(smol_redrafter):
    client = smol_redrafter.client()
    drafted = accepted = 0
    for question in ("Give me three tips for staying focused while studying.",
                     "Explain in two sentences what photosynthesis is."):
        ref = generate(["--chat", "-p", question, "-n", "48"])
        r = client.chat.completions.create(model=MODEL, temperature=0, max_completion_tokens=48,
                                           messages=[{"role": "user", "content": question}],
                                           extra_body={"return_token_ids": True})
        assert r.choices[0].message.content == ref["text"]
        assert r.choices[0].model_extra["token_ids"] == ref["tokens"]
        spec = r.model_extra["specdec"]
        assert spec["method"] == "redrafter"
        drafted += spec["drafted_tokens"]
        accepted += spec["accepted_tokens"]
    assert drafted > 0 and 0 < accepted <= drafted
    m = smol_redrafter.metrics()
    assert m['specdec_spec_decode_num_draft_tokens_total{method="redrafter"}'] >= drafted
    assert m['specdec_spec_decode_num_accepted_tokens_total{method="redrafter"}'] >= accepted


def test_generate_redrafter_equals_plain():
    question = "Write a haiku about autumn leaves."
    plain = generate(["--chat", "-p", question, "-n", "40"])
    spec = generate(["--chat", "-p", question, "-n", "40", "--spec", "redrafter"])
    assert spec["tokens"] == plain["tokens"]


def test_a_model_without_a_head_is_a_clear_error():
    out = subprocess.run([str(BINARY), "generate", "-m", str(TINY), "-p", "Once", "-n", "4",
                          "--spec", "redrafter"], capture_output=True, timeout=60)
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "no redrafter head trained for this model" in err, err
    assert "train-drafter" in err
