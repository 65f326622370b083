#!/usr/bin/env bash
# Download, on a machine that reaches PyPI, the wheels dpfl needs on the GPU check machine (issue 67, item 3), which
# has its own python3 3.12 with torch 2.11 (CUDA 13), pytest, numpy, scipy, scikit-learn, matplotlib, typer, rich and
# pyyaml but NO package registry. Only what it lacks is fetched (pyproject.toml's other dependencies and the pieces
# the GPU tests and the benchmark import), each pinned and with --no-deps, so pip never pulls torch, numpy or scipy:
# a dependency added to one of these packages must be added to the list below by hand. CPython 3.12, manylinux
# x86_64 up to glibc 2.28 (what torch 2.11's own wheels need). scripts/gpu_check.sh installs them from the folder with
# --no-index. The folder travels with the tree (at most 64 MiB in all), so it must stay under 45 MiB.
#
#   scripts/gpu_wheels.sh            # into gpu_wheels/ (git-ignored); PIP="python3 -m pip" by default
#   WHEELS=/tmp/w scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-gpu_wheels}
PIP=${PIP:-python3 -m pip}
LIMIT_MIB=45
# The versions of the project's venv (`make install`) when this was written; every one within pyproject.toml's range.
PACKAGES=(
  # dpfl's own dependencies that the GPU machine lacks
  dp-accounting==0.6.0 absl-py==2.5.1 attrs==23.2.0 dm-tree==0.1.10 wrapt==2.5.2 mpmath==1.3.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  # the Opacus comparison of benchmarks/engine.py (the `bench` extra) and what the test suite's helpers may import
  opacus==1.6.0 opt-einsum==3.4.0
  hypothesis==6.170.27 sortedcontainers==2.4.0
  # the build backend of dpfl's own pyproject.toml (setuptools>=77), for `pip install --no-index .` in a build venv
  setuptools==84.2.1
)
mkdir -p "$WHEELS"
# shellcheck disable=SC2086  # PIP is a command line
$PIP download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --dest "$WHEELS" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any "${PACKAGES[@]}"
# one file per package: a wheel of another version left from an earlier run would make the install ambiguous
stale=$(ls "$WHEELS"/*.whl | wc -l)
if [ "$stale" -ne "${#PACKAGES[@]}" ]; then
  echo "error: $WHEELS holds $stale wheels for ${#PACKAGES[@]} packages; empty it and run again" >&2
  exit 1
fi
bytes=$(du -sb "$WHEELS" | cut -f1)
mib=$(( (bytes + (1 << 20) - 1) >> 20 ))
echo "$WHEELS: ${#PACKAGES[@]} wheels, $bytes bytes (${mib} MiB, limit $LIMIT_MIB MiB)"
if [ "$bytes" -gt $(( LIMIT_MIB << 20 )) ]; then
  echo "error: $WHEELS exceeds $LIMIT_MIB MiB; the tree that travels to the GPU machine is capped at 64 MiB" >&2
  exit 1
fi
