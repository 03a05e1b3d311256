#!/bin/bash
# timed-stages.sh MAKE STAGE... - `make test`'s driver: run each stage as `MAKE STAGE`, in
# order, stopping at the first that fails; then print one line per stage with its duration.
#
# Each stage runs once: the ones before it are passed as --assume-old, so that `setup`,
# `kernels` and `deb`, prerequisites of later stages, are not made again. The summary is
# printed whatever happens (a stage that fails, Ctrl-C); the exit status is the failed
# stage's, 0 when every stage passed. Under `make -n` the stages print their commands.
set -uo pipefail

make=$1
shift
stages=("$@")
made=()
took=()
failed=""
status=0
trap 'status=130' INT TERM  # the stage's make sees the signal too; its failure ends the loop

for stage in "${stages[@]}"; do
    start=$SECONDS
    "$make" --no-print-directory "${made[@]/#/--assume-old=}" "$stage"
    rc=$?
    took+=($((SECONDS - start)))
    if [ "$rc" -ne 0 ] || [ "$status" -ne 0 ]; then
        failed=$stage
        [ "$status" -ne 0 ] || status=$rc
        break
    fi
    made+=("$stage")
done

total=0
echo
echo "make test: the time of each stage"
for i in "${!stages[@]}"; do
    stage=${stages[$i]}
    if [ "$i" -lt "${#took[@]}" ]; then
        total=$((total + took[i]))
        note=$([ "$stage" = "$failed" ] && echo "  FAILED (exit $status)")
        printf '  %-16s %6d s%s\n' "$stage" "${took[$i]}" "$note"
    else
        printf '  %-16s %8s\n' "$stage" "not run"
    fi
done
printf '  %-16s %6d s (%d min %d s)\n' "total" "$total" $((total / 60)) $((total % 60))
exit "$status"
