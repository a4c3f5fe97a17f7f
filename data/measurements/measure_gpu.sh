#!/usr/bin/env bash
# Spends a few minutes of a GPU on ground truth, in the order the data lacks it most: the host's cost per
# operator, the search spaces' candidates, the user's path (`measure --quick` and `measure --space`, as a
# user runs them), the same models eager and compiled, Vidur's LLM GEMMs at fp16 weights, the operator sweep
# and the model manifest, each in a process of its own (a broken CUDA context ends one step, not the session).
#
#   bash data/measurements/measure_gpu.sh FOLDER [SECONDS] [cuda|cpu] [FROM]
#
# FOLDER receives at most eight files, none deeper than two folders, to copy back from the GPU's machine:
# session.log (everything printed, with each step's exit status and seconds), host/, spaces/, user/, compiled/, the
# sweep of Vidur's GEMMs (sweeps/<gpu>-vidur.csv), the operator sweep and the model rows, each named after
# the GPU. This GPU's files in FROM (default data/measurements) are copied to FOLDER first, so every step
# resumes where the last session stopped and each file comes back whole: copy it over the one in FROM. A
# copied file that no step changed is removed at the end. SECONDS (default 540) bounds the whole script;
# every step is also stopped by `timeout` a minute past its budget, which loses at most the configuration
# in flight. Kernel profiles and the repeatability manifest are for a second call (README.md beside this).
# The test of this script sets SESSION_CAMPAIGN_ARGS (more arguments for every campaign step),
# SESSION_QUICK_ARGS and SESSION_SPACE_ARGS (the user's `measure` arguments in place of `--quick` and
# `--space mobilenetv3`) to measure tiny models instead.
set -u -o pipefail
folder=${1:?give the folder the files go to}
total=${2:-540}
device=${3:-cuda}
from=${4:-data/measurements}
export PYTHONUNBUFFERED=1
mkdir -p "$folder"
log="$folder/session.log"
python=$(command -v python3 || command -v python)
deadline=$((SECONDS + total))
read -r -a campaign_args <<< "${SESSION_CAMPAIGN_ARGS:-}"
read -r -a quick_args <<< "${SESSION_QUICK_ARGS:---quick}"
read -r -a space_args <<< "${SESSION_SPACE_ARGS:---space mobilenetv3}"

say() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$log"; }

gpu_state() {
    if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu,mig.mode.current,memory.used --format=csv 2>&1 | tee -a "$log"
    fi
}

budget_of() {  # $1: a share of the time left (1 for all of it), $2: at least this many seconds
    awk -v l="$((deadline - SECONDS - 10))" -v s="$1" -v m="${2:-0}" \
        'BEGIN { b = int(l * s); if (b < m) b = (m < l ? m : l); print (b > 0 ? b : 0) }'
}

campaign_step() {  # $1: step name, $2: its share of the time left (1 for the last), $3: at least
    local budget began
    budget=$(budget_of "$2" "${3:-0}")
    if [ "$budget" -lt 5 ]; then
        say "campaign step $1: no time left"
        return
    fi
    say "campaign step $1: $budget s"
    began=$SECONDS
    timeout $((budget + 60)) "$python" -m dippm_nas.cli campaign --out-dir "$folder" --budget-s "$budget" \
        --steps "$1" --device "$device" ${campaign_args[@]+"${campaign_args[@]}"} 2>&1 | tee -a "$log"
    say "step $1 exit status ${PIPESTATUS[0]} in $((SECONDS - began)) s"
}

user_step() {  # $1: a name for the log, $2: its share of the time left; the rest: `dippm-nas measure` arguments
    local name=$1 share=$2 budget began
    shift 2
    budget=$(budget_of "$share")
    if [ "$budget" -lt 5 ]; then
        say "user's $name: no time left"
        return
    fi
    say "user's $name: dippm-nas measure $* --out $folder/user/$slug.csv ($budget s)"
    mkdir -p "$folder/user"
    began=$SECONDS
    timeout $((budget + 60)) "$python" -m dippm_nas.cli measure "$@" --out "$folder/user/$slug.csv" \
        --device "$device" --budget-s "$budget" 2>&1 | tee -a "$log"
    say "user's $name exit status ${PIPESTATUS[0]} in $((SECONDS - began)) s"
}

say "session: $total s on $device, files to $folder"
copied=()
slug=$("$python" -c "from dippm_nas.measure.campaign import gpu_slug; print(gpu_slug('$device'))")
if [ "$(realpath "$from")" != "$(realpath "$folder")" ]; then
    for file in "$from/$slug".csv "$from/$slug"-[0-9]*.csv "$from"/{host,spaces,user,compiled,sweeps}/"$slug".csv \
            "$from/sweeps/$slug-vidur.csv"; do
        [ -f "$file" ] || continue
        mkdir -p "$folder/$(dirname "${file#"$from"/}")"
        cp "$file" "$folder/${file#"$from"/}" && say "resuming from $file" && copied+=("${file#"$from"/}")
    done
fi
gpu_state
campaign_step host 0.05 20
campaign_step spaces 0.45
user_step quick 0.25 "${quick_args[@]}"
user_step space 0.35 "${space_args[@]}"
campaign_step compiled 0.3
campaign_step gemms 0.3
campaign_step sweep 0.4
campaign_step models 1
gpu_state
for file in ${copied[@]+"${copied[@]}"}; do  # what comes back is only what this session wrote
    if cmp -s "$from/$file" "$folder/$file"; then
        rm "$folder/$file" && say "unchanged, not brought back: $file"
    fi
done
say "session done in $SECONDS s"
