#!/usr/bin/env bash
# dpfl's checks on a machine with one GPU and no package registry (issue 67, item 3), in at most about 5 minutes:
#   1. a venv over the machine's own python3 (3.12, torch 2.11 with CUDA) with --system-site-packages, the wheels
#      scripts/gpu_wheels.sh downloaded beforehand installed from gpu_wheels/ with --no-index, and dpfl with --no-deps;
#   2. torch, CUDA and GPU versions;
#   3. the tests marked `gpu` (tests/gpu/; none found is recorded, not an error);
#   4. benchmarks/engine.py on the device, synthetic data, at cohorts of 24, 240 and 2,400 clients, few steps.
# Every piece runs under `timeout`, capped by what is left of the whole budget; one JSON of results goes to
# $OUT/gpu_check.json (OUT defaults to ./gpu_out), the logs beside it. Exit status 0 when every piece passed.
#
#   scripts/gpu_wheels.sh                      # here, with a registry: fills gpu_wheels/ (git-ignored)
#   scripts/gpu_check.sh                       # there, in the repository root
#   GPU_CHECK_DEVICE=cpu scripts/gpu_check.sh  # anywhere: the same pieces on the CPU at tiny sizes
# Settings (environment): GPU_CHECK_PYTHON (python3), GPU_CHECK_DEVICE (cuda), GPU_CHECK_BUDGET_S (285: the whole
# run), GPU_CHECK_COHORTS, GPU_CHECK_STEPS, GPU_CHECK_SAMPLES, GPU_CHECK_REPEATS, GPU_CHECK_LOOP_CLIENTS,
# GPU_CHECK_VENV (a scratch dir), WHEELS (gpu_wheels), OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)
PY0=${GPU_CHECK_PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
BUDGET=${GPU_CHECK_BUDGET_S:-285}
WHEELS=${WHEELS:-gpu_wheels}
OUT=${OUT:-$ROOT/gpu_out}
if [ -n "${GPU_CHECK_VENV:-}" ]; then
  VENV=$GPU_CHECK_VENV
else
  VENV=$(mktemp -d /tmp/dpfl-gpu-venv.XXXXXX)
  trap 'rm -rf "$VENV"' EXIT  # a scratch venv of this run only
fi
if [ "$DEVICE" = cpu ]; then  # a dry run of every piece, small enough for a 2-core machine
  COHORTS=${GPU_CHECK_COHORTS:-"3 6 12"}; STEPS=${GPU_CHECK_STEPS:-"2 2 2"}; SAMPLES=${GPU_CHECK_SAMPLES:-40}
  REPEATS=${GPU_CHECK_REPEATS:-1}; LOOP_CLIENTS=${GPU_CHECK_LOOP_CLIENTS:-2}
  T_INSTALL=60; T_TESTS=120; T_BENCH=(60 60 60)
else
  COHORTS=${GPU_CHECK_COHORTS:-"24 240 2400"}; STEPS=${GPU_CHECK_STEPS:-"20 10 5"}; SAMPLES=${GPU_CHECK_SAMPLES:-240}
  REPEATS=${GPU_CHECK_REPEATS:-3}; LOOP_CLIENTS=${GPU_CHECK_LOOP_CLIENTS:-24}
  T_INSTALL=40; T_TESTS=100; T_BENCH=(40 45 60)
fi
mkdir -p "$OUT"
rm -f "$OUT"/piece_*.json
read -r -a COHORT_LIST <<< "$COHORTS"
read -r -a STEP_LIST <<< "$STEPS"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# cap a piece's timeout by what is left of the budget (at least 5 s, so a piece that cannot run says so)
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
# piece NAME RC SECONDS LOG [JSON-FILE]: one record for the final JSON (written by python3's json, no quoting here)
piece() {
  "$PY0" - "$OUT/piece_$1.json" "$1" "$2" "$3" "$4" "${5:-}" <<'PYEOF'
import json, pathlib, sys
out, name, rc, seconds, log, result = sys.argv[1:7]
text = pathlib.Path(log).read_text(errors="replace") if log and pathlib.Path(log).exists() else ""
rec = {"name": name, "rc": int(rc), "timed_out": int(rc) in (124, 137), "seconds": int(seconds),
       "log": pathlib.Path(log).name if log else None, "log_tail": text[-3000:]}
if result:
    try:
        rec["result"] = json.loads(pathlib.Path(result).read_text())
    except Exception as exc:  # noqa: BLE001 -- a piece that died before writing its JSON
        rec["result"] = None
        rec["result_error"] = f"{type(exc).__name__}: {exc}"
pathlib.Path(out).write_text(json.dumps(rec))
PYEOF
}

# ---- 1. install
t0=$(date +%s)
(
  set -x
  "$PY0" -m venv --system-site-packages --without-pip "$VENV" &&
  PY="$VENV/bin/python" &&
  # python3's own site-packages also when python3 is itself a venv (a venv on a venv sees only the base's): after
  # the new venv's, so what is installed here comes first
  "$PY0" -c 'import site; print("\n".join([*site.getsitepackages(), site.getusersitepackages()]))' \
    > "$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_python3_site.pth" &&
  # pip comes from python3's site-packages and installs into the venv; --isolated: no pip configuration of the
  # machine. With dependency resolution but no index, so a dependency neither on the machine nor among the wheels
  # fails here, by name.
  timeout "$(cap "$T_INSTALL")" "$PY" -m pip install --isolated --disable-pip-version-check --no-index \
    --find-links "$WHEELS" dp-accounting pydantic cryptography opacus hypothesis &&
  # dpfl itself, from a copy (the build writes build/ and egg-info beside its sources), in an isolated build venv
  # whose setuptools comes from the wheels too; else with the environment's own setuptools
  mkdir -p "$VENV/dpfl-src" && cp -r pyproject.toml README.md src "$VENV/dpfl-src/" &&
  { timeout "$(cap 30)" "$PY" -m pip install --isolated --disable-pip-version-check --no-index --no-deps \
      --find-links "$WHEELS" "$VENV/dpfl-src" ||
    timeout "$(cap 30)" "$PY" -m pip install --isolated --disable-pip-version-check --no-index --no-deps \
      --no-build-isolation "$VENV/dpfl-src"; }
) > "$OUT/install.log" 2>&1
rc=$?
PY="$VENV/bin/python"
[ -x "$PY" ] || PY=$PY0
piece install $rc $(( $(date +%s) - t0 )) "$OUT/install.log"
# the tree's own code, whether or not the package install went through (the log says)
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

# ---- 2. versions
"$PY" - > "$OUT/versions.json" 2> "$OUT/versions.log" <<'PYEOF'
import json, platform, sys
import torch
v = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available(), "executable": sys.executable}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    v.update(device_name=p.name, device_count=torch.cuda.device_count(), capability=f"{p.major}.{p.minor}",
             memory_gib=round(p.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version())
from importlib.metadata import version
for mod, dist in (("dpfl", "dpfl"), ("opacus", "opacus"), ("dp_accounting", "dp-accounting"),
                  ("pydantic", "pydantic"), ("cryptography", "cryptography"), ("numpy", "numpy"), ("scipy", "scipy")):
    try:
        m = __import__(mod)  # importable, and from where (the tree's src for dpfl)
        v[mod] = f"{version(dist)} ({m.__file__})"
    except Exception as exc:  # noqa: BLE001
        v[mod] = f"not importable: {type(exc).__name__}: {exc}"
print(json.dumps(v))
PYEOF
piece versions $? 0 "$OUT/versions.log" "$OUT/versions.json"
cat "$OUT/versions.json"

# ---- 3. the tests marked gpu
t0=$(date +%s)
if [ -d tests/gpu ]; then
  # addopts off: pyproject's -n auto needs pytest-xdist, which the machine lacks
  timeout "$(cap "$T_TESTS")" "$PY" -m pytest -o addopts="" -p no:cacheprovider -m gpu -q -rA tests/gpu \
    --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  [ $rc -eq 5 ] && echo "pytest: no test marked gpu was collected (exit 5)" >> "$OUT/gpu_tests.log"
else
  echo "no tests/gpu folder: nothing to run" > "$OUT/gpu_tests.log"
  rc=5
fi
piece gpu_tests $rc $(( $(date +%s) - t0 )) "$OUT/gpu_tests.log"
tail -3 "$OUT/gpu_tests.log"

# ---- 4. the engine benchmark per cohort
for i in "${!COHORT_LIST[@]}"; do
  k=${COHORT_LIST[$i]}
  s=${STEP_LIST[$i]:-${STEP_LIST[-1]}}
  m=$(( LOOP_CLIENTS < k ? LOOP_CLIENTS : k ))
  t0=$(date +%s)
  timeout "$(cap "${T_BENCH[$i]:-60}")" "$PY" benchmarks/engine.py --json --device "$DEVICE" --data synthetic \
    --clients "$k" --steps "$s" --samples "$SAMPLES" --batch 8 --repeats "$REPEATS" --loop-clients "$m" \
    > "$OUT/engine_$k.json" 2> "$OUT/engine_$k.log"
  rc=$?
  piece "engine_$k" $rc $(( $(date +%s) - t0 )) "$OUT/engine_$k.log" "$OUT/engine_$k.json"
  echo "engine.py, $k clients x $s steps: exit $rc ($(( $(date +%s) - t0 )) s)"
done

# ---- the one JSON
"$PY0" - "$OUT" "$START" "$DEVICE" "$BUDGET" <<'PYEOF'
import json, pathlib, platform, sys, time
out, start, device, budget = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
pieces = [json.loads(p.read_text()) for p in sorted(out.glob("piece_*.json"), key=lambda p: p.stat().st_mtime)]
by = {p["name"]: p for p in pieces}
tests = by.get("gpu_tests", {})
tests["found"] = tests.get("rc") != 5
summary = {}
for name, p in by.items():
    if name.startswith("engine_") and p.get("result"):
        r = p["result"]
        summary[r["clients"]] = {k: r.get(k) for k in (
            "steps", "dpfl_seconds", "vectorised_nonprivate_seconds", "dpfl_nonprivate_seconds", "opacus_seconds",
            "nonprivate_loop_seconds", "dp_overhead_vs_vectorised_nonprivate", "dp_overhead_vs_dpfl_nonprivate",
            "speedup_vs_opacus", "speedup_vs_nonprivate_loop", "dpfl_fraction_of_peak", "dpfl_fraction_of_bf16_peak",
            "vectorised_nonprivate_fraction_of_peak", "loops_extrapolated", "errors", "cuda_peak_memory_mib")}
ok = (by.get("install", {}).get("rc") == 0 and by.get("versions", {}).get("rc") == 0
      and tests.get("rc") in (0, 5)
      and all(p["rc"] == 0 for n, p in by.items() if n.startswith("engine_"))
      and any(n.startswith("engine_") for n in by))
result = {"ok": ok, "device": device, "host": platform.node(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "total_seconds": int(time.time()) - start, "budget_seconds": budget,
          "versions": by.get("versions", {}).get("result"), "engine_summary": summary, "pieces": by}
(out / "gpu_check.json").write_text(json.dumps(result, indent=2))
print(f"{out / 'gpu_check.json'}: ok={ok}, {result['total_seconds']} s")
sys.exit(0 if ok else 1)
PYEOF
