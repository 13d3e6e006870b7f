#!/usr/bin/env bash
# The CUDA device check, on a bare GPU machine with no package index, from
# the tree and what scripts/gpu_pack.sh put in .gpu/ (wheels, a trimmed
# llama.cpp, the random-weight model writer):
#   1. installs the wheels, writes the models, builds llama.cpp for this GPU;
#   2. runs the first model load in both import orders, llmctl with and
#      without its fix, and the variants that locate the crash;
#   3. measures llmctl against llama-bench and llama-server from the same
#      build (scripts/gpu_measure.py).
# Every step has a timeout, and the whole run ends by GPU_CHECK_SECONDS
# (570). Results go to $OUT/gpu_check.json as they come, the steps' log to
# $OUT/steps.txt and every log to $OUT/logs.tgz.
#   bash scripts/gpu_check.sh              # on the GPU machine
#   PYTHON=.venv/bin/python bash scripts/gpu_check.sh --cpu
#                                          # a rehearsal here: CPU build, tiny model
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$REPO/.gpu"
OUT="${OUT:-/tmp/gpu-check-out}"
WORK="${GPU_CHECK_WORK:-/tmp/gpu-check-work}"
CPU=0
[[ "${1:-}" == --cpu ]] && CPU=1
mkdir -p "$OUT" "$WORK/logs"
START=$SECONDS
DEADLINE=$((START + ${GPU_CHECK_SECONDS:-570}))
PY="${PYTHON:-python3}"
B="$WORK/build"

say() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*" | tee -a "$OUT/steps.txt"; }
# step NAME LIMIT CMD...: CMD under LIMIT seconds (never past the deadline),
# its output in logs/NAME.log, its exit status in steps.txt and returned.
step() {
  local name=$1 limit=$2 left=$((DEADLINE - SECONDS)) rc
  shift 2
  ((limit > left)) && limit=$left
  if ((limit <= 0)); then say "$name: skipped, no time left"; return 124; fi
  say "$name (limit ${limit}s)"
  timeout -k 5 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  rc=$?
  say "$name: rc $rc"
  return $rc
}
save_logs() { tar -czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null; }

say "machine: $(nproc) cores; $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || echo no GPU)"
# A rehearsal uses this machine's environment (PYTHON=.venv/bin/python):
# the wheels are the GPU image's Python's (3.12).
if ((CPU)); then
  export PYTHONPATH="$REPO" PYTHONUNBUFFERED=1
else
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$PACK"/whl/*.whl >"$WORK/logs/wheels.log" 2>&1 || say "wheels: failed"
  export PYTHONPATH="/tmp/site:$REPO" PYTHONUNBUFFERED=1
fi
"$PY" -m pip show typer rich httpx anyio numpy 2>/dev/null | grep -E '^(Name|Version)' \
  | paste -sd' ' >>"$OUT/steps.txt"

# The models, written while llama.cpp builds (numpy and gguf only).
( "$PY" "$PACK/make_gguf.py" --tiny --out "$WORK/tiny.gguf" >"$WORK/logs/tiny.log" 2>&1
  if ((CPU)); then cp "$WORK/tiny.gguf" "$WORK/model.gguf"
  else "$PY" "$PACK/make_gguf.py" --out "$WORK/model.gguf" >"$WORK/logs/model.log" 2>&1; fi ) &
models=$!

# llama.cpp for this GPU's architecture only (9.0 -> 90): the libraries
# first, then llama-server and llama-bench beside the crash probes.
if [[ -n "${GPU_CHECK_BUILT:-}" ]]; then
  B="$GPU_CHECK_BUILT"
  say "build: using $B"
else
  tar -xzf "$PACK/llama_trim.tar.gz" -C "$WORK"
  export PATH="$PATH:/usr/local/cuda/bin"
  generator="Unix Makefiles"
  command -v ninja >/dev/null && generator=Ninja
  flags=(-G "$generator" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
         -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
         -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  if ((CPU)); then flags+=(-DGGML_CUDA=OFF)
  else
    arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
    flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch")
  fi
  step configure 60 cmake -S "$WORK/llama.cpp" -B "$B" "${flags[@]}"
  step build-libs 330 cmake --build "$B" -j "$(nproc)" --target llama ggml || { save_logs; exit 1; }
fi
export LLAMA_CPP_LIB_PATH="$B/bin" LD_LIBRARY_PATH="$B/bin:${LD_LIBRARY_PATH:-}"
if [[ ! -x "$B/bin/llama-server" || ! -x "$B/bin/llama-bench" ]]; then
  ( step build-tools 200 cmake --build "$B" -j "$(nproc)" --target llama-server llama-bench ) &
  tools=$!
else
  tools=""
fi
wait $models
save_logs

# The crash: numpy before llama_cpp, then llama_cpp first; llmctl without
# its fix and with it; then the variants that say where the fault lies.
cat >"$WORK/trace.c" <<'EOF'
/* A native stack for a fatal signal on any thread (LD_PRELOAD). */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
static void on_fault(int sig) {
    void *frames[48];
    const char head[] = "\n--- native stack ---\n";
    write(2, head, sizeof head - 1);
    backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void arm(void) {
    void *warm[1];
    backtrace(warm, 1);                 /* loads libgcc_s now, not inside the handler */
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGABRT};
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_fault);
}
EOF
gcc -shared -fPIC -O1 -o "$WORK/trace.so" "$WORK/trace.c" 2>"$WORK/logs/trace-build.log"
probe() { step "$1" 60 env "${@:3}" LD_PRELOAD="$WORK/trace.so" "$PY" "$REPO/scripts/gpu_probe.py" \
            "$WORK/tiny.gguf" --first "$2"; }
# llmctl_run NAME [VAR=VALUE ...] [--backend-sampling-off]
llmctl_run() {
  local name=$1 vars=() flags=()
  shift
  for a in "$@"; do [[ $a == --backend-sampling-off ]] && flags+=(--backend-sampling off) || vars+=("$a"); done
  step "$name" 90 env ${vars[@]+"${vars[@]}"} LLMCTL_HOME="$WORK/home" LD_PRELOAD="$WORK/trace.so" \
    "$PY" -X faulthandler -m llmctl run "$WORK/tiny.gguf" "Say hi" --max-tokens 16 \
    --temperature 0 --n-gpu-layers 99 ${flags[@]+"${flags[@]}"}
}
probe probe-numpy-first numpy
probe probe-llama-first llama
llmctl_run llmctl-without-fix LLMCTL_NO_PRELOAD=1
llmctl_run llmctl-with-fix
llmctl_run llmctl-host-sampling --backend-sampling-off
probe probe-numpy-first-one-blas-thread numpy OPENBLAS_NUM_THREADS=1
probe probe-numpy-first-no-gpu numpy CUDA_VISIBLE_DEVICES=
step probe-numpy-first-gpu-init-first 60 env LD_PRELOAD="$WORK/trace.so" "$PY" \
  "$REPO/scripts/gpu_probe.py" "$WORK/tiny.gguf" --first numpy --gpu-init-first
step llmctl-info 40 env LLMCTL_HOME="$WORK/home" "$PY" -m llmctl info --json
cp "$WORK/logs/llmctl-info.log" "$OUT/info.json" 2>/dev/null
save_logs

[[ -n "$tools" ]] && wait "$tools"
measure=(--model "$WORK/model.gguf" --bin "$B/bin" --out "$OUT/gpu_check.json")
((CPU)) && measure+=(--tiny --slots 4 --ctx 2048)
step measure $((DEADLINE - SECONDS - 10)) "$PY" "$REPO/scripts/gpu_measure.py" "${measure[@]}"
"$PY" - "$OUT" "$WORK/logs" <<'EOF'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
path = out / "gpu_check.json"
data = json.loads(path.read_text()) if path.exists() else {}
data["steps"] = {m[1]: int(m[2]) for m in re.finditer(r"\] (\S+): rc (\d+)", (out / "steps.txt").read_text())}
logs = Path(sys.argv[2])
texts = [(logs / f"{n}.log").read_text().strip() if (logs / f"{n}.log").exists() else None
         for n in ("llmctl-with-fix", "llmctl-host-sampling")]
data["greedy text, backend sampling = host sampling"] = texts[0] is not None and texts[0] == texts[1]
path.write_text(json.dumps(data, indent=1))
EOF
save_logs
say "done"
