#!/usr/bin/env bash
# The main job: verify, compile and run every example on the CPU build, results checked against torch.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATAC=${STRATAC:-stratac}
for f in examples/*.strata; do
  $STRATAC check "$f" --world 1-8
done
$STRATAC compile examples/*.strata -o out/generated
for f in examples/*.strata; do
  case "$(basename "$f")" in
    moe_*int8*) size=(--tokens 256 --hidden 1024 --topk 4 --routing skewed --dtype bf16) ;;  # int8 in, bf16 out
    moe_*|alltoallv*) size=(--tokens 256 --hidden 1024 --topk 4 --routing skewed) ;;  # routed tokens
    *) size=(--size 4M) ;;
  esac
  # 4 ranks (every peer loop has three peers); worlds 1-8 of every
  # example run in the test suite (tests/e2e)
  $STRATAC run "$f" --world 4 "${size[@]}" --cores 8 --iters 2 --check
done
echo "run_all: every example verified, compiled and checked on 4 ranks, two calls each"
