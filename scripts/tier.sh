#!/usr/bin/env bash
# Time one stage of the tests (or of CI) and keep its time for a summary at the end.
#
#   scripts/tier.sh NAME -- CMD...     run CMD, print "tier NAME: S s (passed|failed)",
#                                      append "NAME S STATUS" to $TIER_LOG if set, and
#                                      exit with CMD's status (pytest's 5, no tests
#                                      selected, counts as passed)
#   scripts/tier.sh --summary [LIMIT]  print every stage in $TIER_LOG and the total,
#                                      against LIMIT seconds when given (CI's limit)
set -uo pipefail

if [ "${1:-}" = --summary ]; then
    limit="${2:-}"
    [ -n "${TIER_LOG:-}" ] && [ -s "$TIER_LOG" ] || { echo "tiers: nothing timed"; exit 0; }
    awk -v limit="$limit" '
        { printf "  %-14s %6d s  %s\n", $1, $2, ($3 == 0 ? "passed" : "FAILED (exit " $3 ")")
          total += $2 }
        END {
            if (limit == "") { printf "  %-14s %6d s\n", "total", total; exit }
            printf "  %-14s %6d s  of %d s (%.0f%%): %s\n", "total", total, limit,
                   100 * total / limit, (total <= limit ? "within the limit" : "OVER THE LIMIT")
        }' "$TIER_LOG"
    exit 0
fi

if [ $# -lt 3 ] || [ "$2" != -- ]; then
    echo "usage: $0 NAME -- CMD... | $0 --summary [LIMIT_SECONDS]" >&2
    exit 2
fi
name="$1"
shift 2
echo "tier $name: $(printf '%q ' "$@")"
began=$(date +%s)
"$@"
status=$?
seconds=$(( $(date +%s) - began ))
if [ $status = 5 ] && [[ " $* " == *" pytest "* ]]; then
    status=0  # pytest's "no tests collected": a PYTEST_ARGS -k that leaves a tier empty
fi
echo "tier $name: ${seconds} s ($([ $status = 0 ] && echo passed || echo "failed, exit $status"))"
if [ -n "${TIER_LOG:-}" ]; then
    echo "$name $seconds $status" >> "$TIER_LOG"
fi
exit $status
