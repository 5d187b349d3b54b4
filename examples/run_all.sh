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
  for w in 2 4; do
    $STRATAC run "$f" --world "$w" "${size[@]}" --cores 8 --iters 2 --check
  done
done
echo "run_all: every example verified, compiled and checked on 2 and 4 ranks, two calls each"
