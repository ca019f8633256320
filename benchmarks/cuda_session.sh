#!/usr/bin/env bash
# One GPU session in one go, for a lent NVIDIA machine (H100/H200, python3 with torch, transformers, numba and
# numba-cuda already there; no network): install, a random-weight model, the CUDA tests, then the benchmarks.
#
#     bash benchmarks/cuda_session.sh                          # every step, from the repository root
#     STEPS="install model profile" bash benchmarks/cuda_session.sh
#     DRY_RUN=1 OUT=/tmp/dry bash benchmarks/cuda_session.sh  # print the commands, run none
#
# Elsewhere (a CPU check): PY=.venv/bin/python MODEL_LAYERS=2 THREADS=2 STEPS="model profile throughput" ...
#
# The machine needs no network: the ignored folders below travel with the tree.
#   .whl/            cp312 wheels: numpy 2.4.6 (numba-cuda 0.30.4 compiles no kernel with numpy 2.5), numba-cuda
#                    0.30.4, structlog, gguf; installed into $SITE, which goes first on PYTHONPATH.
#   .gpu/tokenizer/  the embedded SmolLM2's tokenizer as Hugging Face files (tokenizer.json, tokenizer_config.json,
#                    chat_template.jinja): the 98 MB GGUF is too large to carry, so the benchmarks run on random
#                    bf16 weights of its shape, written on the machine by transformers, with its real tokenizer.
#   $BASELINE        optional: another tree's kernels (git archive REV kernels/hetero_kernels, unpacked), timed by
#                    attention.py (and throughput.py with BASELINE_THROUGHPUT=1) first on PYTHONPATH.
#
# Steps (STEPS picks them; they run in this order) and their time on an H200; BUDGET_S caps the whole run, and
# each command has its own timeout on top:
#   prepare     not by default: writes .whl and .gpu/tokenizer here, before a session (PY=.venv/bin/python)
#   install     wheels into $SITE, the repo editable (-e) so entry points register; versions, GPU    ~45 s
#   model       random bf16 weights of the embedded model's shape in $MODEL_DIR, tokenizer checked   ~20 s
#   tests       $TESTS (the CUDA device tests compile kernels per drawn shape: minutes)              >180 s
#   attention   benchmarks/attention.py --gpu-only, float16 and bfloat16 caches; then each of
#               $GPU_SHAPES and $BASELINE, float16                                                 ~20 s + 13 s each
#   profile     step_profile.py: bf16 torch attention batch 1 and 32, float16 numba-cuda batch 1    ~25 s each
#   throughput  throughput.py standard,sequential: bf16 torch, float16 numba-cuda; transformers-bf16
#               (standard only) if 60 s are left                                                    ~45 s each
# Everything printed also goes to $OUT/session.log; the summary table, last, also to $OUT/summary.txt.
set -u
set -o pipefail
export PYTHONUNBUFFERED=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

STEPS=${STEPS:-"install model tests attention profile throughput"}
OUT=${OUT:-/tmp/cuda-session}
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
MODEL_DIR=${MODEL_DIR:-/tmp/model}
MODEL_LAYERS=${MODEL_LAYERS:-30}
THREADS=${THREADS:-8}
NUMBA_DTYPE=${NUMBA_DTYPE:-float16}  # the numba-cuda runs' dtype (README's H200 rows: float16, the GGUF's auto)
BUDGET_S=${BUDGET_S:-400}
DRY_RUN=${DRY_RUN:-0}
GPU_SHAPES=${GPU_SHAPES:-"words_per_lane=2 rows_per_step=2 words_per_lane=2,rows_per_step=8"}  # attention.py --gpu-shape variants
TESTS=${TESTS:-"kernels/tests/test_cuda_device.py plugins/hetero-executor-numba/tests"}
TESTS_S=${TESTS_S:-180}
BASELINE_THROUGHPUT=${BASELINE_THROUGHPUT:-0}  # 1: throughput.py with the baseline kernels too
BASELINE=${BASELINE:-.gpu/baseline}  # an earlier hetero_kernels (git archive REV kernels/hetero_kernels), if carried

mkdir -p "$OUT" || exit 1
LOG=$OUT/session.log
SUMMARY=$OUT/summary.txt
LAST=$(mktemp /tmp/cuda-session-step.XXXXXX)  # the last command's output, for its headline
: >"$LOG"
STARTED=$(date +%s)
DEADLINE=$((STARTED + BUDGET_S))
ROWS=()      # "step|command|status|seconds", one per command
FIGURES=()   # headline lines picked from the commands' output

PROJECTS=(. kernels plugins/*/)
PROJECTS=("${PROJECTS[@]%/}")
FALLBACK_MARK=$SITE/.hetero-on-pythonpath  # written when the editable install failed: the repo goes on PYTHONPATH
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
repo_on_pythonpath() {
    local project dir
    for project in "${PROJECTS[@]}"; do
        dir=$ROOT/$project
        PYTHONPATH+=":${dir%/.}"
    done
}
[[ -e $FALLBACK_MARK ]] && repo_on_pythonpath

say() { printf '%s\n' "$*" | tee -a "$LOG"; }
wants() { [[ " $STEPS " == *" $1 "* ]]; }
section() { say ""; say "======== $1 ($(($(date +%s) - STARTED)) s in, $((DEADLINE - $(date +%s))) s left) ========"; }

# run STEP LABEL LIMIT_S COMMAND...: one command under its own timeout (cut to the time left), its output into
# the log; KEEP=REGEX (set for the call) copies matching output lines into the summary's figures.
run() {
    local step=$1 label=$2 limit=$3 rc started seconds status
    shift 3
    local left=$((DEADLINE - $(date +%s)))
    ((limit > left)) && limit=$left
    if ((limit < 15)); then
        say "---- $label: skipped, ${left} s left of BUDGET_S=$BUDGET_S"
        ROWS+=("$step|$label|skipped (no time)|0")
        return 0
    fi
    say "---- $label (timeout ${limit} s)"
    say "\$ $*"
    started=$(date +%s)
    if [[ $DRY_RUN == 1 ]]; then
        rc=0
        : >"$LAST"
    else
        timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG" | tee "$LAST"
        rc=${PIPESTATUS[0]}
    fi
    seconds=$(($(date +%s) - started))
    case $rc in
        0) status=ok ;;
        124 | 137) status="TIMEOUT after ${limit} s" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    if ((rc == 0)) && grep -q ' failed (exit ' "$LAST"; then  # throughput.py reports a peer's failure, exits 0
        status="FAILED (a peer's process)"
        rc=1
    fi
    ROWS+=("$step|$label|$status|$seconds")
    if [[ -n ${KEEP:-} ]]; then
        local line
        while IFS= read -r line; do FIGURES+=("[$label] ${line#"${line%%[![:space:]]*}"}"); done \
            < <(grep -E -- "$KEEP" "$LAST" | cut -c1-200)
    fi
    return "$rc"
}

# ------------------------------------------------------------------------------------------------- prepare
if wants prepare; then  # before a session, on a machine with the project's venv and a package index
    section "[prepare] the folders that travel: .whl and .gpu/tokenizer"
    run prepare "wheels" 300 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl numpy==2.4.6 numba-cuda==0.30.4 structlog==26.1.0 gguf==0.19.0
    run prepare "tokenizer" 180 "$PY" - .gpu/tokenizer <<'EOF'
import sys

import transformers

from hetero_core.model_source import embedded_model_path

path = embedded_model_path()
tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
print("wrote", tokenizer.save_pretrained(sys.argv[1]))
EOF
fi

# ------------------------------------------------------------------------------------------------- install
if wants install; then
    section "[install] wheels into $SITE, the repository editable, versions"
    run install "wheels" 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
    editable=()
    for project in "${PROJECTS[@]}"; do editable+=(-e "$project"); done
    run install "editable install" 150 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
        "${editable[@]}"
    # Every project's entry points must be visible; if not (pip or setuptools failed), write their metadata into
    # $SITE from the pyproject files and put the folders on PYTHONPATH instead.
    KEEP='entry points' run install "entry points" 30 "$PY" - "$SITE" "${PROJECTS[@]}" <<'EOF' ||
import importlib.metadata as metadata, sys, tomllib
from pathlib import Path

projects = sys.argv[2:]
expected = {}
for folder in projects:
    project = tomllib.loads(Path(folder, "pyproject.toml").read_text())["project"]
    expected[project["name"]] = project
found = {e.name for e in metadata.entry_points(group="hetero_infer")}
wanted = {n for p in expected.values() for n in p.get("entry-points", {}).get("hetero_infer", {})}
missing = sorted(wanted - found) + [n for n in expected if not any(True for _ in metadata.distributions(name=n))]
print(f"entry points: {len(found & wanted)} of {len(wanted)} found; missing: {', '.join(missing) or 'none'}")
sys.exit(1 if missing else 0)
EOF
    {
        say "---- the editable install left entry points out: metadata into $SITE, the repository on PYTHONPATH"
        [[ $DRY_RUN == 1 ]] || "$PY" - "$SITE" "${PROJECTS[@]}" <<'EOF' 2>&1 | tee -a "$LOG"
import sys, tomllib
from pathlib import Path

site = Path(sys.argv[1])
for folder in sys.argv[2:]:
    project = tomllib.loads(Path(folder, "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project.get("entry-points", {}).get("hetero_infer", {})
    (info / "entry_points.txt").write_text("[hetero_infer]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    print("wrote", info)
EOF
        mkdir -p "$SITE" && touch "$FALLBACK_MARK"
        repo_on_pythonpath
        say "PYTHONPATH=$PYTHONPATH"
    }
    KEEP='^(python|torch|numba|numpy|transformers|GPU|plugins)' run install "versions" 60 "$PY" - <<'EOF'
import importlib.metadata as metadata, sys
import numpy, torch, numba, transformers
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("numba", numba.__version__, "| numba-cuda", metadata.version("numba-cuda"))
print("numpy", numpy.__version__, numpy.__file__)
print("transformers", transformers.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
    from numba import cuda
    print("numba.cuda", cuda.__file__, "sees", cuda.get_current_device().name)
from hetero_core.plugins import create_plugin_manager, describe_plugins
plugins = describe_plugins(create_plugin_manager())
print("plugins:", ", ".join(p["name"] + ("" if "broken" not in p else " (broken)") for p in plugins))
for p in plugins:
    if "broken" in p:
        print(f"  {p['name']}: {p['broken'][:200]}")
EOF
    run install "nvidia-smi" 30 nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version \
        --format=csv
fi

# ------------------------------------------------------------------------------------------------- model
if wants model; then
    section "[model] random bf16 weights of the embedded model's shape ($MODEL_LAYERS layers) in $MODEL_DIR"
    KEEP='^(wrote|tokenizer|chat)' run model "random HF folder" 120 "$PY" - "$MODEL_DIR" "$MODEL_LAYERS" \
        .gpu/tokenizer <<'EOF'
import shutil, sys
from pathlib import Path

import torch, transformers

folder, layers, tokenizer = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
torch.manual_seed(0)
config = transformers.LlamaConfig(  # SmolLM2-135M: /work/shared/MODEL.md
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, tie_word_embeddings=True, rms_norm_eps=1e-5,
    max_position_embeddings=8192, rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)
shutil.rmtree(folder, ignore_errors=True)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
for file in tokenizer.iterdir():
    shutil.copy(file, folder / file.name)
print("wrote", folder, sorted(p.name for p in folder.iterdir()))

from hetero_tokenizer_hf.tokenizer import load_tokenizer  # the engine's own reading of the folder

loaded = load_tokenizer(folder)
ids = loaded.encode("Hello, world! 12345")
assert loaded.decode(ids) == "Hello, world! 12345", loaded.decode(ids)
assert (loaded.vocab_size, loaded.bos_token_id, loaded.eos_token_id) == (49152, 1, 2)
chat = loaded.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>assistant\n"), chat
print(f"tokenizer: vocab {loaded.vocab_size}, bos {loaded.bos_token_id}, eos {loaded.eos_token_id}, ids {ids}")
print("chat template:", repr(chat))
EOF
fi

# ------------------------------------------------------------------------------------------------- tests
if wants tests; then
    section "[tests] the CUDA kernels and the numba-cuda executor on the GPU"
    KEEP='^(FAILED|ERROR) |[0-9]+ (passed|failed|errors?|skipped).* in [0-9.]+s' run tests "pytest" "$TESTS_S" "$PY" -m pytest -q -x \
        $TESTS -p no:cacheprovider
fi

# ------------------------------------------------------------------------------------------------- attention
if wants attention; then
    section "[attention] the numba-cuda decode kernel against torch's gather + SDPA"
    attention=("$PY" benchmarks/attention.py --gpu-only --gpu-batches 1 16 64 --gpu-contexts 256 1024 8192)
    KEEP='(copy bandwidth|GB/s)' run attention "attention.py" 150 "${attention[@]}" --gpu-dtypes float16 bfloat16
    for shape in $GPU_SHAPES; do
        KEEP='(GB/s)' run attention "attention.py $shape" 90 "${attention[@]}" --gpu-dtypes float16 --gpu-shape "$shape"
    done
    if [[ -d $BASELINE ]]; then
        KEEP='(GB/s)' run attention "attention.py, baseline kernels" 90 env PYTHONPATH="$BASELINE:$PYTHONPATH" \
            "${attention[@]}" --gpu-dtypes float16
    fi
fi

# ------------------------------------------------------------------------------------------------- profile
if wants profile; then
    section "[profile] decode steps on $MODEL_DIR (README: 2.46 ms batch 1, 2.36 ms batch 32, numba-cuda 2.56 ms)"
    profile=("$PY" benchmarks/step_profile.py --model "$MODEL_DIR" --rows 12)
    KEEP='^(cuda|cpu|decode steps)' run profile "bf16 torch, batch 1" 90 \
        "${profile[@]}" --dtype bfloat16 --attention torch --batch 1
    KEEP='^(cuda|cpu|decode steps)' run profile "bf16 torch, batch 32" 90 \
        "${profile[@]}" --dtype bfloat16 --attention torch --batch 32
    KEEP='^(cuda|cpu|decode steps)' run profile "$NUMBA_DTYPE numba-cuda, batch 1" 120 \
        "${profile[@]}" --dtype "$NUMBA_DTYPE" --executor numba-cuda --batch 1
fi

# ------------------------------------------------------------------------------------------------- throughput
if wants throughput; then
    section "[throughput] standard and sequential on $MODEL_DIR (README: bf16 5,411 / 318 tok/s)"
    throughput=("$PY" benchmarks/throughput.py --model "$MODEL_DIR" --threads "$THREADS")
    KEEP='(^workload|tok/s end-to-end|failed)' run throughput "hetero bf16 torch" 120 \
        "${throughput[@]}" --workloads standard,sequential --peers hetero --dtype bfloat16 --attention torch
    KEEP='(^workload|tok/s end-to-end|failed)' run throughput "hetero $NUMBA_DTYPE numba-cuda" 150 \
        "${throughput[@]}" --workloads standard,sequential --peers hetero --dtype "$NUMBA_DTYPE" \
        --attention numba-cuda
    if [[ -d $BASELINE && $BASELINE_THROUGHPUT == 1 ]]; then
        KEEP='(^workload|tok/s end-to-end|failed)' run throughput "numba-cuda, baseline kernels" 150 \
            env PYTHONPATH="$BASELINE:$PYTHONPATH" "${throughput[@]}" --workloads standard,sequential --peers hetero \
            --dtype "$NUMBA_DTYPE" --attention numba-cuda
    fi
    if ((DEADLINE - $(date +%s) >= 60)); then
        KEEP='(^workload|tok/s end-to-end|failed)' run throughput "transformers-bf16" 90 \
            "${throughput[@]}" --workloads standard --peers transformers-bf16
    else
        say "---- transformers-bf16: skipped, under 60 s left"
        ROWS+=("throughput|transformers-bf16|skipped (no time)|0")
    fi
fi

# ------------------------------------------------------------------------------------------------- summary
rm -f "$LAST"
{
    echo ""
    echo "======== summary: $(($(date +%s) - STARTED)) s in all (BUDGET_S=$BUDGET_S, STEPS=\"$STEPS\") ========"
    printf '%-10s  %-30s  %-26s  %7s\n' step command status seconds
    for row in "${ROWS[@]}"; do
        IFS='|' read -r step label status seconds <<<"$row"
        printf '%-10s  %-30s  %-26s  %7s\n' "$step" "$label" "$status" "$seconds"
    done
    if ((${#FIGURES[@]})); then
        echo ""
        echo "figures:"
        printf '  %s\n' "${FIGURES[@]}"
    fi
} | tee "$SUMMARY" | tee -a "$LOG"
failed=0
for row in "${ROWS[@]}"; do [[ $row == *"|ok|"* || $row == *"|skipped"* ]] || failed=1; done
exit "$failed"
