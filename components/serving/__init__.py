"""Online tool selection on Ray Serve: detection → (rewrite) → retrieval → LLM selection.

The pieces are plain classes so they run in-process (tests, benchmarks' baselines) as well as in
Serve replicas; :mod:`.app` wraps them as deployments and composes the graph:

- :mod:`.schemas`      request / response models of the HTTP API
- :mod:`.catalog`      tool names and parameter schemas from a dataset's corpus
- :mod:`.calibration`  score-threshold tool-usage detector for methods without ``detect``
- :mod:`.models`       loaded detector and retriever (artifact + version), the in-process fast path
- :mod:`.rewriter`     the query-rewriting slot (pass-through, history, causal LM)
- :mod:`.selector*`    the LLM selector: constrained local LM, OpenAI-compatible HTTP, or none
- :mod:`.deployments`  the Serve deployments; :mod:`.ingress` the FastAPI ingress
"""
