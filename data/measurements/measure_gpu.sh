#!/usr/bin/env bash
# Spends a few minutes of a GPU on ground truth: the repeatability manifest, the campaign's four steps
# each in a process of its own (a broken CUDA context ends one step, not the session), the repeatability
# manifest again.
#
#   bash data/measurements/measure_gpu.sh OUT_DIR [SECONDS] [cuda|cpu] [FROM]
#
# OUT_DIR receives at most eight files, none deeper than two folders, to copy back from the GPU's
# machine: session.log (everything printed), repeat-a.csv and repeat-b.csv (data/manifests/memcheck.csv
# measured in two fresh processes, first and last), host/, sweeps/, kernels/ and the model rows,
# each named after the GPU. This GPU's files in FROM (default data/measurements) are copied to
# OUT_DIR first, so every step resumes where the last session stopped and each file comes back whole:
# copy it over the one in FROM. A copied file that no step changed is removed at the end. SECONDS
# (default 540) bounds the whole script; every step is also stopped by `timeout` a minute past its
# budget, which loses at most the configuration in flight.
# The test of this script sets SESSION_REPEAT_MANIFEST, SESSION_REPEAT_S and SESSION_CAMPAIGN_ARGS (more
# arguments for every campaign step) to measure a tiny model instead.
set -u -o pipefail
out=${1:?give the folder the files go to}
total=${2:-540}
device=${3:-cuda}
from=${4:-data/measurements}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
log="$out/session.log"
python=$(command -v python3 || command -v python)
deadline=$((SECONDS + total))
repeat_manifest=${SESSION_REPEAT_MANIFEST:-data/manifests/memcheck.csv}
repeat_s=${SESSION_REPEAT_S:-75}  # each pass of the six memcheck configurations
read -r -a campaign_args <<< "${SESSION_CAMPAIGN_ARGS:-}"

say() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$log"; }

gpu_state() {
    if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu,mig.mode.current,memory.used --format=csv 2>&1 | tee -a "$log"
    fi
}

repeat_pass() {  # $1: a or b
    say "repeatability pass $1: $repeat_manifest in a fresh process"
    timeout $((repeat_s + 60)) "$python" -m dippm_nas.cli measure --manifest "$repeat_manifest" \
        --out "$out/repeat-$1.csv" --device "$device" --budget-s "$repeat_s" 2>&1 | tee -a "$log"
    say "pass $1 exit status ${PIPESTATUS[0]}"
}

campaign_step() {  # $1: step name, $2: its share of the campaign time left (1 for the last), $3: at least
    local left=$((deadline - SECONDS - repeat_s - 15))
    local budget=$(awk -v l="$left" -v s="$2" -v m="${3:-0}" \
        'BEGIN { b = int(l * s); if (b < m) b = (m < l ? m : l); print (b > 0 ? b : 0) }')
    if [ "$budget" -lt 5 ]; then
        say "campaign step $1: no time left"
        return
    fi
    say "campaign step $1: $budget s"
    timeout $((budget + 60)) "$python" -m dippm_nas.cli campaign --out-dir "$out" --budget-s "$budget" \
        --steps "$1" --device "$device" ${campaign_args[@]+"${campaign_args[@]}"} 2>&1 | tee -a "$log"
    say "step $1 exit status ${PIPESTATUS[0]}"
}

say "session: $total s on $device, files to $out"
copied=()
slug=$("$python" -c "from dippm_nas.measure.campaign import gpu_slug; print(gpu_slug('$device'))")
if [ "$(realpath "$from")" != "$(realpath "$out")" ]; then
    for file in "$from/$slug".csv "$from/$slug"-[0-9]*.csv "$from"/{host,sweeps,kernels}/"$slug".csv; do
        [ -f "$file" ] || continue
        mkdir -p "$out/$(dirname "${file#"$from"/}")"
        cp "$file" "$out/${file#"$from"/}" && say "resuming from $file" && copied+=("${file#"$from"/}")
    done
fi
gpu_state
repeat_pass a
campaign_step host 0.1 20
campaign_step sweep 0.35
campaign_step models 0.85
campaign_step kernels 1
repeat_pass b
gpu_state
for file in ${copied[@]+"${copied[@]}"}; do  # what comes back is only what this session wrote
    if cmp -s "$from/$file" "$out/$file"; then
        rm "$out/$file" && say "unchanged, not brought back: $file"
    fi
done
say "session done in $SECONDS s"
