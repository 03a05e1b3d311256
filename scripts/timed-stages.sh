#!/bin/bash
# timed-stages.sh MAKE STAGE... [-- LANE...] - `make test`'s driver.
#
# The STAGEs run first, one after the other, each as `MAKE STAGE`. Then the LANEs run side
# by side, each a quoted list of stages run in its order ("lint test-host" "test-guest-7.3
# test-systemd"): the QEMU guests keep about 1.3 of this machine's 2 cores busy and the host
# stages the rest, so the lanes end sooner together than one after the other.
#
# A stage runs once: the stages made before it (in the serial part and in its own lane) are
# passed as --assume-old, so that `setup` or `deb`, prerequisites of later stages, are not
# made again. A lane's stage writes its output to build/test-logs/STAGE.log, printed whole
# when the stage ends, so that two lanes' lines never mix. The first stage that fails stops
# everything: its lane stops there, and the other lanes are stopped (their stage counts as
# "stopped"). At the end, whatever happened (Ctrl-C included), one line per stage with its
# duration, then the wall time. The exit status is the first failed stage's, 0 when all
# passed. Under `make -n` the stages print their commands.
set -uo pipefail

make=$1
shift
serial=()
lanes=()
while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then
        shift
        lanes=("$@")
        break
    fi
    serial+=("$1")
    shift
done

logs=build/test-logs
rm -rf "$logs" && mkdir -p "$logs"
began=$SECONDS
status=0
lane_pids=()

# run_stage STAGE ASSUME_OLD...: make STAGE; records "SECONDS RC" in $logs/STAGE.done
run_stage() {
    local stage=$1 start=$SECONDS rc
    shift
    "$make" --no-print-directory "${@/#/--assume-old=}" "$stage"
    rc=$?
    echo "$((SECONDS - start)) $rc" > "$logs/$stage.done"
    return "$rc"
}

# run_lane "STAGE STAGE...": the lane's stages in order, each logged and printed when done
run_lane() {
    local done_before=("${serial[@]}") stage rc
    for stage in $1; do
        { flock 9; echo "[make test] $stage: started (log: $logs/$stage.log)"; } 9> "$logs/.print"
        run_stage "$stage" "${done_before[@]}" > "$logs/$stage.log" 2>&1
        rc=$?
        {
            flock 9
            echo "================================ $stage (exit $rc)"
            cat "$logs/$stage.log"
        } 9> "$logs/.print"
        [ "$rc" -eq 0 ] || return "$rc"
        done_before+=("$stage")
    done
}

stop_lanes() {
    local pid
    for pid in "${lane_pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
}
trap 'status=130; stop_lanes' INT TERM

made=()
for stage in "${serial[@]}"; do
    run_stage "$stage" "${made[@]}" || { status=$?; break; }
    made+=("$stage")
done

if [ "$status" -eq 0 ] && [ ${#lanes[@]} -gt 0 ]; then
    for lane in "${lanes[@]}"; do
        # its own process group, so that stopping it reaches make, pytest and qemu alike
        setsid bash -c "$(declare -f run_stage run_lane); $(declare -p make logs serial);
            run_lane \"\$1\"" lane "$lane" &
        lane_pids+=($!)
    done
    live=("${lane_pids[@]}")
    while [ ${#live[@]} -gt 0 ]; do
        ended=""
        wait -n -p ended "${live[@]}"
        rc=$?
        [ -n "${ended:-}" ] || continue   # a trapped signal woke the wait
        for i in "${!live[@]}"; do [ "${live[$i]}" != "$ended" ] || unset 'live[i]'; done
        if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$rc
            stop_lanes
        fi
    done
fi

echo
echo "make test: the time of each stage"
all=("${serial[@]}")
for lane in "${lanes[@]}"; do
    # shellcheck disable=SC2206  # a lane is a list of words
    all+=($lane)
done
for stage in "${all[@]}"; do
    if [ -f "$logs/$stage.done" ]; then
        read -r took rc < "$logs/$stage.done"
        note=""
        [ "$rc" -eq 0 ] || note="  FAILED (exit $rc)"
        printf '  %-16s %6d s%s\n' "$stage" "$took" "$note"
    elif [ -f "$logs/$stage.log" ]; then
        printf '  %-16s %8s\n' "$stage" "stopped"
    else
        printf '  %-16s %8s\n' "$stage" "not run"
    fi
done
wall=$((SECONDS - began))
printf '  %-16s %6d s (%d min %d s), the lanes side by side\n' "wall time" "$wall" \
    $((wall / 60)) $((wall % 60))
exit "$status"
