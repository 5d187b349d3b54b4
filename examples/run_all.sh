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
  for w in 1 2 4; do
    $STRATAC run "$f" --world "$w" --size 4M --cores 8 --iters 3 --check
  done
done
echo "run_all: every example verified, compiled and checked on 1, 2 and 4 ranks"
