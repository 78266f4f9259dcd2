"""What a serving replica of a BM25 artifact imports: no torch or transformers. Each replica start
(a hot swap with new args, a replacement, an autoscaled replica) would pay for them: about a second
of CPU for torch alone on 2 cores, and its memory in every replica."""

from __future__ import annotations

import json
import subprocess
import sys

from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)

REPLICA = """
import json, sys
HEAVY = ("torch", "transformers")
import components.serving.deployments  # the module Serve imports in every replica
from components.serving.models import DetectorModel, RetrieverModel
artifact, detector_file = sys.argv[1], sys.argv[2]
ranking = RetrieverModel(artifact).retrieve(["weather forecast for Paris"], 3)[0]
probability = DetectorModel(artifact, detector_file=detector_file).probabilities(["hello there"])[0]
print(json.dumps({"ranked": len(ranking), "p": probability,
                  "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def test_a_bm25_replica_loads_ranks_and_detects_without_torch(bm25_versions):
    argv = [sys.executable, "-c", REPLICA, bm25_versions["default"], bm25_versions["detector_file"]]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["ranked"] == 3 and 0.0 <= seen["p"] <= 1.0
    assert seen["heavy"] == []
