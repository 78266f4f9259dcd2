"""The bm25 method package (see method.py).

bm25s imports JAX where it is installed (for its top-k) and runs one top-k at import. On a machine
with a GPU, JAX's default is then to reserve 75 % of that GPU's memory in every process that
imports bm25s: on one H200 a query-generation driver held 105.6 GiB through it before its LM or the
Ray Train worker beside it could allocate anything, and both failed out of memory
(benchmarks/results/querygen_toollens_gpu.md). BM25's top-k of a few hundred scores needs no GPU,
so JAX runs it on the CPU here, and if a caller asks for JAX on a GPU anyway it allocates on demand.
Both are defaults: a value already in the environment wins. Set here, before any module of this
package (method.py, analyzers.py) imports bm25s.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
