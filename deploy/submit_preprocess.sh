#!/usr/bin/env bash
# Submit the Ray Data preprocessing job to a running cluster (`ray up ray_cluster.yaml`).
#   RAY_ADDRESS=http://127.0.0.1:8265 deploy/submit_preprocess.sh s3://bucket/toollens s3://bucket/prepared/toollens
set -euo pipefail
data=${1:?usage: $0 DATA_URL OUTPUT_URL}
out=${2:?usage: $0 DATA_URL OUTPUT_URL}
ray job submit --working-dir "$(dirname "$0")/.." -- \
  toolscout preprocess --data "$data" --out "$out" preprocess.parallelism=64
