#!/usr/bin/env python3
"""Writes the hand-made seed inputs of fuzz/corpus/ (a few hundred bytes each, never a model
file). Run once after changing it; the files are committed. Inputs kept from fuzzer findings
live beside the seeds under names starting with `crash-` and are not written here."""
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "corpus"

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, payload):
    return gstr(key) + struct.pack("<I", typ) + payload


def arr(elem, items, fmt=None):
    body = b"".join(gstr(x) for x in items) if elem == STR else b"".join(
        struct.pack(fmt, x) for x in items)
    return struct.pack("<IQ", elem, len(items)) + body


def tensor(name, dims, typ, offset):
    return (gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", typ, offset))


def gguf(kvs, tensors=(), data=b"", version=3, align=32):
    head = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs)) + b"".join(kvs)
    head += b"".join(tensors)
    if tensors:
        head += b"\0" * (-len(head) % align)
    return head + data


def spm_vocab():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [
        "\u2581", "\u2581a", "b", "\u2581ab", "c"]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    scores = [0.0] * len(tokens)
    scores[-5:] = [-1.0, -2.0, -3.0, -0.5, -4.0]
    return [kv("tokenizer.ggml.model", STR, gstr("llama")),
            kv("tokenizer.ggml.tokens", ARR, arr(STR, tokens)),
            kv("tokenizer.ggml.scores", ARR, arr(F32, scores, "<f")),
            kv("tokenizer.ggml.token_type", ARR, arr(I32, types, "<i")),
            kv("tokenizer.ggml.bos_token_id", U32, struct.pack("<I", 1)),
            kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", 2)),
            kv("tokenizer.ggml.unknown_token_id", U32, struct.pack("<I", 0))]


def bpe_vocab():
    # byte-level BPE: the printable bytes as GPT-2 maps them, a merge, a control token
    tokens = [chr(c) for c in range(33, 127)] + ["\u0120", "\u0120a", "ab", "<|im_end|>"]
    types = [1] * (len(tokens) - 1) + [3]
    return [kv("tokenizer.ggml.model", STR, gstr("gpt2")),
            kv("tokenizer.ggml.pre", STR, gstr("smollm")),
            kv("tokenizer.ggml.tokens", ARR, arr(STR, tokens)),
            kv("tokenizer.ggml.token_type", ARR, arr(I32, types, "<i")),
            kv("tokenizer.ggml.merges", ARR, arr(STR, ["\u0120 a", "a b"])),
            kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", len(tokens) - 1))]


def every_type():
    return [kv("general.architecture", STR, gstr("llama")),
            kv("t.u8", U8, struct.pack("<B", 7)), kv("t.i8", I8, struct.pack("<b", -7)),
            kv("t.u16", U16, struct.pack("<H", 700)), kv("t.i16", I16, struct.pack("<h", -700)),
            kv("t.u32", U32, struct.pack("<I", 70000)), kv("t.i32", I32, struct.pack("<i", -7)),
            kv("t.f32", F32, struct.pack("<f", 0.5)), kv("t.bool", BOOL, b"\x01"),
            kv("t.u64", U64, struct.pack("<Q", 2**63 + 1)), kv("t.i64", I64, struct.pack("<q", -1)),
            kv("t.f64", F64, struct.pack("<d", 1e300)),
            kv("t.ai32", ARR, arr(I32, [1, -2, 3], "<i")),
            kv("t.af64", ARR, arr(F64, [0.25], "<d")),
            kv("t.astr", ARR, arr(STR, ["x", ""])),
            kv("t.abool", ARR, arr(BOOL, [0, 1], "<B"))]


def llama_config():
    return [kv("general.architecture", STR, gstr("llama")),
            kv("llama.context_length", U32, struct.pack("<I", 128)),
            kv("llama.embedding_length", U32, struct.pack("<I", 8)),
            kv("llama.block_count", U32, struct.pack("<I", 1)),
            kv("llama.feed_forward_length", U32, struct.pack("<I", 16)),
            kv("llama.attention.head_count", U32, struct.pack("<I", 2)),
            kv("llama.attention.head_count_kv", U32, struct.pack("<I", 1)),
            kv("llama.attention.layer_norm_rms_epsilon", F32, struct.pack("<f", 1e-5)),
            kv("llama.rope.dimension_count", U32, struct.pack("<I", 4))]


def gguf_seeds():
    f32_tensor = gguf(every_type(), [tensor("w", [4, 2], 0, 0), tensor("b", [4], 0, 32)],
                      struct.pack("<8f", *range(8)) + b"\0" * 0 + struct.pack("<4f", 1, 2, 3, 4))
    return {
        "minimal-v3": gguf([kv("general.architecture", STR, gstr("llama"))]),
        "empty-v2": gguf([], version=2),
        "every-type": gguf(every_type()),
        "tensors": f32_tensor,
        "truncated": f32_tensor[:-9],
        "aligned-64": gguf([kv("general.alignment", U32, struct.pack("<I", 64))],
                           [tensor("q", [32], 8, 0)], b"\0" * 34, align=64),  # one Q8_0 block
        "offset-past-end": gguf([], [tensor("w", [4], 0, 4096)], b"\0" * 16),
        "bad-magic": b"GGUX" + gguf([])[4:],
        "nested-array": gguf([kv("a", ARR, struct.pack("<IQ", ARR, 1) + arr(U8, [1], "<B"))]),
        "huge-count": struct.pack("<IIQQ", 0x46554747, 3, 0, 2**62),
        # 2^31 x 2^31 float32: 2^62 elements, 2^64 bytes; the byte count must not wrap
        "huge-tensor": gguf([], [tensor("w", [2**31, 2**31], 0, 0)], b"\0" * 64),
        "spm-vocab": gguf(spm_vocab()),
        "bpe-vocab": gguf(bpe_vocab()),
        "llama-config": gguf(llama_config() + spm_vocab()),
    }


def tokenizer_seeds():
    ids = lambda *xs: struct.pack(f"<{len(xs)}I", *xs)
    return {
        "spm-encode": b"\x00Once upon a time, there was a little girl.",
        "spm-encode-specials": b"\x06<s>Hello</s> world",
        "spm-encode-invalid-utf8": b"\x02\xff\xfe\xc0\x80 caf\xc3\xa9 \xf0\x9f\x98",
        "bpe-encode": b"\x01Hello world! 123 \xe2\x80\x94 caf\xc3\xa9",
        "bpe-encode-chat": b"\x07<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "bpe-encode-invalid-utf8": b"\x01\xff\xc0\xaf emoji \xf0\x9f\x98\x80\xf0\x9f",
        "spm-decode": b"\x68" + ids(1, 400, 20, 3, 260, 5),
        "spm-decode-bytes": b"\x48" + ids(3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 3 + 0xFF),
        "bpe-decode": b"\x79" + ids(1, 2, 3, 28120, 49151, 0),
        "bpe-decode-out-of-range": b"\x09" + ids(5, 0xFFFFFFFF, 2**31, 49152),
        "spm-decode-negative": b"\x08" + ids(0x80000000),
    }


def chat_template_seeds():
    msg = lambda role, content: role.encode() + b"\x02" + content.encode()
    conv = b"\x01".join([msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello"),
                          msg("user", "What is 2+2?")])
    smollm = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
              "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
              "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
              "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")
    return {
        "chatml-smollm2": smollm.encode() + b"\x00" + conv,
        "chatml-empty-template": b"\x00" + conv,
        "llama3": b"<|start_header_id|>{{ bos_token }}\x00" + conv,
        "llama2-alternating": b"[INST] <<SYS>>\x00" + b"\x01".join([msg("user", "a"), msg("assistant", "b")]),
        "gemma-system": b"<start_of_turn>\x00" + conv,
        "phi3": b"<|user|> <|end|>\x00" + msg("user", "x"),
        "unknown": b"{{ something else }}\x00" + msg("user", "x"),
    }


def request_seeds():
    return {
        "completion": b'{"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7, "seed": 3, "stop": ["\\n"], "logprobs": 2}',
        "completion-ids": b'{"prompt": [[1, 2, 3], [4]], "n": 2, "stream": true, "stream_options": {"include_usage": true}}',
        "chat": b'{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_completion_tokens": 8, "logprobs": true, "top_logprobs": 3, "stop_token_ids": [2]}',
        "bad-types": b'{"prompt": 5, "n": "two", "max_tokens": -1, "temperature": "hot"}',
        "deep": b"[" * 100 + b"]" * 100,
        "invalid-utf8": b'{"prompt": "\xff\xfe"}',
        "not-json": b"prompt=hello",
    }


def main():
    for target, seeds in (("gguf", gguf_seeds()), ("tokenizer", tokenizer_seeds()),
                          ("chat_template", chat_template_seeds()), ("request", request_seeds())):
        d = ROOT / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (d / name).write_bytes(data)
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
