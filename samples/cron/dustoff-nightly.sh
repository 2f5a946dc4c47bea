#!/usr/bin/env bash
# A nightly dustoff job for cron or a systemd timer (README.md, "Nightly jobs"): computes only the
# records of the archive that are new or changed since the last night (--incremental), lets a
# few bad records pass (--max-error-rate), and turns dustoff's exit code into what a scheduler
# should do. It does not depend on the current folder (cron runs in $HOME).
#
# Settings (environment; from the crontab line, a systemd EnvironmentFile, or the file named
# by NIGHTLY_ENV, e.g. /etc/dustoff/nightly.env):
#   DUSTOFF            the dustoff binary (default: `dustoff` on PATH)
#   DUSTOFF_MODEL      the model (dustoff reads it when --model is not given)
#   DUSTOFF_PIPELINES  folders of pipeline files (dustoff also looks beside its binary)
#   PIPELINE           pipeline name or path (default: summarize)
#   INPUT              the archive: a file or a glob, e.g. '/srv/archive/*.jsonl.gz' (required)
#   OUTPUT             the output file, .jsonl or .parquet (required)
#   MAX_ERROR_RATE     share of error rows that still counts as success (default: 0.01)
#   DEVICE             auto, cpu, cuda, cuda:N (default: auto)
#   LOG_FILE           dustoff's log, appended, one timestamp per line (default: $OUTPUT.log)
#
# Exit codes: 0 done (also: nothing new tonight, or last night's run still busy: skipped);
# otherwise dustoff's own (2 fix the settings, 3 error rows over the tolerance, 4 interrupted:
# run it again to resume, 1 other errors); see `dustoff --help`.
set -uo pipefail

if [ -n "${NIGHTLY_ENV:-}" ]; then
    # shellcheck source=/dev/null
    . "$NIGHTLY_ENV"
fi
DUSTOFF=${DUSTOFF:-dustoff}
PIPELINE=${PIPELINE:-summarize}
MAX_ERROR_RATE=${MAX_ERROR_RATE:-0.01}
DEVICE=${DEVICE:-auto}
if [ -z "${INPUT:-}" ] || [ -z "${OUTPUT:-}" ]; then
    echo "dustoff-nightly: set INPUT (the archive) and OUTPUT (the output file)" >&2
    exit 2
fi
LOG_FILE=${LOG_FILE:-$OUTPUT.log}
mkdir -p "$(dirname "$OUTPUT")" "$(dirname "$LOG_FILE")"

now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

rc=0
"$DUSTOFF" run "$PIPELINE" \
    --input "$INPUT" \
    --output "$OUTPUT" \
    --device "$DEVICE" \
    --incremental \
    --max-error-rate "$MAX_ERROR_RATE" \
    --log-file "$LOG_FILE" \
    --quiet || rc=$?

case $rc in
    0) echo "$(now) dustoff-nightly: done: $OUTPUT (summary in $LOG_FILE)" ;;
    5) echo "$(now) dustoff-nightly: skipped: an earlier run of this job is still working on $OUTPUT"
       rc=0 ;;
    3) echo "$(now) dustoff-nightly: error rows over --max-error-rate $MAX_ERROR_RATE (or past --max-errors): see $OUTPUT.errors.jsonl" >&2 ;;
    4) echo "$(now) dustoff-nightly: interrupted; run this script again to resume from the checkpoint (before the archive changes)" >&2 ;;
    2) echo "$(now) dustoff-nightly: dustoff refused the settings (exit 2): see $LOG_FILE" >&2 ;;
    *) echo "$(now) dustoff-nightly: failed (exit $rc): see $LOG_FILE" >&2 ;;
esac
exit "$rc"
