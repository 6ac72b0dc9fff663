#!/usr/bin/env bash
# A jobq worker in bash + curl: runs a command for each job of a queue. The job's payload (JSON) is the
# command's stdin; its environment has JOBQ_JOB_ID, JOBQ_ATTEMPT and JOBQ_MAX_ATTEMPTS.
#   exit 0   -> complete, with the command's stdout as the result (JSON if it parses, else a string); the
#               result rides on the next claim (one request per job), or goes by itself when the worker
#               stops or the server does not take completes on a claim
#   exit 65  -> fail for good (EX_DATAERR: retrying cannot help)
#   other    -> fail this attempt; jobq retries it later while attempts remain
# The lease is renewed every third of it while the command runs. If the claim is lost (409/404) or the
# job is cancelled, the command is killed and nothing is sent. SIGTERM/SIGINT: the job in hand finishes,
# then the worker exits.
#
#   JOBQ_URL=http://127.0.0.1:8000 examples/shell-worker.sh emails ./send-email.sh
#
# Nothing secret goes on a command line, where `ps` shows it to every user of the machine: the key reaches
# curl in a header file, bodies (claim tokens, results, errors) in files, values handed to jq or python3
# in their environment; the work directory is the worker's own (mode 700).
#
# Environment: JOBQ_URL, JOBQ_API_KEY (Bearer), JOBQ_WORKER, JOBQ_LEASE_SECONDS (30), JOBQ_WAIT_SECONDS
# (20), JOBQ_EXIT_WHEN_IDLE=1 (exit once a claim comes back empty), JOBQ_JSON=jq|python3 (the JSON tool;
# default jq when installed, else python3).
set -uo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 QUEUE COMMAND [ARGS...]" >&2
  exit 2
fi
QUEUE=$1
shift
BASE=${JOBQ_URL:-http://127.0.0.1:8000}
BASE=${BASE%/}
WORKER=${JOBQ_WORKER:-$(hostname)-$$}
LEASE=${JOBQ_LEASE_SECONDS:-30}
WAIT=${JOBQ_WAIT_SECONDS:-20}
HEARTBEAT=$(awk "BEGIN { print $LEASE / 3 }")
JSON=${JOBQ_JSON:-$(command -v jq >/dev/null && echo jq || echo python3)}
WORK=$(mktemp -d)
# Only the main shell cleans up: a forked child that exits (a command not found) may run this trap too.
trap '[[ $BASHPID == "$$" ]] && rm -rf "$WORK"' EXIT

log() { echo "$(date +%H:%M:%S) $*" >&2; }

# --- JSON, with jq or python3 -------------------------------------------------------------------------

# json_fields FILE: the first claimed job as "id token attempts max_attempts" (or nothing), and its
# payload written to $WORK/payload.
json_fields() {
  if [[ $JSON == jq ]]; then
    jq -c '.jobs[0].payload // empty' "$1" >"$WORK/payload"
    jq -r '.jobs[0] // empty | "\(.id) \(.claim_token) \(.attempts) \(.max_attempts)"' "$1"
  else
    python3 -c '
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
if jobs:
    j = jobs[0]
    open(sys.argv[2], "w").write(json.dumps(j["payload"]))
    print(j["id"], j["claim_token"], j["attempts"], j["max_attempts"])' "$1" "$WORK/payload"
  fi
}

# json_get FILE KEY: a top-level string, number or boolean field.
json_get() {
  if [[ $JSON == jq ]]; then
    jq -r --arg k "$2" '.[$k] // empty' "$1" 2>/dev/null
  else
    python3 -c '
import json, sys
v = json.load(open(sys.argv[1])).get(sys.argv[2])
print("" if v is None else json.dumps(v).strip("\""))' "$1" "$2" 2>/dev/null
  fi
}

# complete_body TOKEN OUTFILE: {"claim_token", "result"}; the output as JSON if it is, else as a string.
complete_body() {
  if [[ $JSON == jq ]]; then
    if jq -e . "$2" >/dev/null 2>&1 && [[ -s $2 ]]; then
      JOBQ_TOKEN=$1 jq -c '{claim_token: env.JOBQ_TOKEN, result: .}' "$2"
    else
      JOBQ_TOKEN=$1 jq -Rsc '{claim_token: env.JOBQ_TOKEN, result: .}' "$2"
    fi
  else
    JOBQ_TOKEN=$1 python3 -c '
import json, os, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
try:
    result = json.loads(text)
except ValueError:
    result = text
print(json.dumps({"claim_token": os.environ["JOBQ_TOKEN"], "result": result}))' "$2"
  fi
}

# complete_item ID TOKEN OUTFILE: {"id", "claim_token", "result"}: one item of a claim's `complete`.
complete_item() {
  if [[ $JSON == jq ]]; then
    complete_body "$2" "$3" | jq -c --argjson id "$1" '{id: $id} + .'
  else
    complete_body "$2" "$3" | python3 -c '
import json, sys
print(json.dumps({"id": int(sys.argv[1]), **json.load(sys.stdin)}))' "$1"
  fi
}

# handed_in FILE: the outcome of the first complete a claim carried ("completed", "claim_lost", ...).
handed_in() {
  if [[ $JSON == jq ]]; then
    jq -r '.completed[0].outcome // empty' "$1" 2>/dev/null
  else
    python3 -c '
import json, sys
done = json.load(open(sys.argv[1])).get("completed") or [{}]
print(done[0].get("outcome", ""))' "$1" 2>/dev/null
  fi
}

# fail_body TOKEN ERROR RETRY: {"claim_token", "error", "retry"}.
fail_body() {
  if [[ $JSON == jq ]]; then
    JOBQ_TOKEN=$1 JOBQ_ERROR=$2 jq -nc --argjson r "$3" '{claim_token: env.JOBQ_TOKEN, error: env.JOBQ_ERROR, retry: $r}'
  else
    JOBQ_TOKEN=$1 JOBQ_ERROR=$2 python3 -c '
import json, os, sys
print(json.dumps({"claim_token": os.environ["JOBQ_TOKEN"], "error": os.environ["JOBQ_ERROR"], "retry": sys.argv[1] == "true"}))' "$3"
  fi
}

# --- HTTP -------------------------------------------------------------------------------------------------

AUTH=()
if [[ -n ${JOBQ_API_KEY:-} ]]; then
  # curl reads the header from this file (`-H @file`): on its command line, `ps` would show the key.
  printf 'Authorization: Bearer %s\n' "$JOBQ_API_KEY" >"$WORK/auth"
  AUTH=(-H "@$WORK/auth")
fi

# api PATH BODYFILE OUT [MAX_TIME]: POST the JSON in BODYFILE, the answer in OUT; prints the status (000:
# no answer). Retries no answer, 429 and 503 after Retry-After: every call here is safe to repeat
# (heartbeat/complete/fail with the same token answer 200 again; a claim whose answer is lost only
# leaves its job claimed until the lease lapses).
api() {
  local path=$1 body=$2 out=$3 max=${4:-10} status attempt after
  for attempt in 1 2 3 4 5; do
    status=$(curl -sS -o "$out" -D "$WORK/headers" -w '%{http_code}' --max-time "$max" \
      -H 'Content-Type: application/json' "${AUTH[@]}" --data-binary "@$body" "$BASE$path" 2>/dev/null)
    status=${status:-000}
    case $status in
      000 | 429 | 503) ;;
      *) echo "$status"; return ;;
    esac
    [[ $attempt == 5 || -n ${STOP:-} ]] && break
    after=$(tr -d '\r' <"$WORK/headers" 2>/dev/null | awk -F': *' 'tolower($1) == "retry-after" { print $2 }')
    sleep "${after:-$attempt}"
  done
  echo "$status"
}

# --- the loop -------------------------------------------------------------------------------------------

STOP=
CLAIMING=
on_signal() {
  log "signal: finishing the job in hand, claiming no more"
  STOP=1
  # Hang up a waiting long-poll; the server releases what it claimed for a request that went away.
  [[ -n $CLAIMING ]] && kill "$CLAIMING" 2>/dev/null
}
trap on_signal TERM INT

# heartbeat ID TOKEN PID: renew the lease until killed; kill PID when the job is no longer ours.
heartbeat() {
  local id=$1 token=$2 pid=$3 status nap=
  # Killed while napping: end the nap too, or an orphaned sleep would hold our stdout open.
  trap '[[ -n $nap ]] && kill "$nap" 2>/dev/null; exit 0' TERM
  trap - INT
  while :; do
    sleep "$HEARTBEAT" &
    nap=$!
    wait "$nap"
    nap=
    printf '{"claim_token":"%s"}' "$token" >"$WORK/heartbeat-body"
    status=$(api "/jobs/$id/heartbeat" "$WORK/heartbeat-body" "$WORK/heartbeat")
    if [[ $status == 409 || $status == 404 ]] || [[ $(json_get "$WORK/heartbeat" cancel_requested) == true ]]; then
      log "job $id: no longer ours (heartbeat: $status); stopping the command"
      touch "$WORK/lost"
      kill "$pid" 2>/dev/null
      return
    fi
    [[ $status == 200 ]] || log "job $id: heartbeat failed ($status); trying again"
  done
}

run_job() {
  local id=$1 token=$2 attempts=$3 max_attempts=$4 pid beat rc status error retry
  shift 4 # the rest is the command
  rm -f "$WORK/lost"
  JOBQ_JOB_ID=$id JOBQ_ATTEMPT=$attempts JOBQ_MAX_ATTEMPTS=$max_attempts \
    "$@" <"$WORK/payload" >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  heartbeat "$id" "$token" "$pid" &
  beat=$!
  # A trapped signal interrupts `wait`; wait again until the command has really ended.
  while :; do
    wait "$pid"
    rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  kill "$beat" 2>/dev/null
  wait "$beat" 2>/dev/null
  if [[ -e $WORK/lost ]]; then
    return
  fi
  if [[ $rc == 0 ]]; then
    if [[ -n $HAND_INS ]]; then
      complete_body "$token" "$WORK/out" >"$WORK/handin-body"
      complete_item "$id" "$token" "$WORK/out" >"$WORK/handin"
      HANDIN=$id
      log "job $id: done; the result goes on the next claim"
    else
      complete_body "$token" "$WORK/out" >"$WORK/body"
      status=$(api "/jobs/$id/complete" "$WORK/body" "$WORK/answer")
      log "job $id: complete -> $status"
    fi
  else
    error="exit $rc: $(tail -c 1000 "$WORK/err")"
    retry=true
    [[ $rc == 65 ]] && retry=false
    fail_body "$token" "$error" "$retry" >"$WORK/body"
    status=$(api "/jobs/$id/fail" "$WORK/body" "$WORK/answer")
    log "job $id: attempt $attempts failed ($error) -> $status $(json_get "$WORK/answer" status)"
  fi
}

# send_handin: complete the job whose result waits for a claim by a request of its own (a repeat with the
# same token is safe: the server answers 200 again if a claim already carried it).
send_handin() {
  [[ -z $HANDIN ]] && return
  local status
  status=$(api "/jobs/$HANDIN/complete" "$WORK/handin-body" "$WORK/answer")
  log "job $HANDIN: complete -> $status"
  HANDIN=
}

HAND_INS=1 # until the server says it does not take completes on a claim
HANDIN=    # the id of the finished job whose result rides on the next claim
log "worker $WORKER on $BASE, queue $QUEUE, JSON by $JSON"
claim="{\"worker\":\"$WORKER\",\"limit\":1,\"lease_seconds\":$LEASE,\"wait_seconds\":$WAIT}"
while [[ -z $STOP ]]; do
  rm -f "$WORK/claim" "$WORK/claim-status"
  body=$claim
  [[ -n $HANDIN ]] && body="${claim%\}},\"complete\":[$(<"$WORK/handin")]}"
  printf '%s' "$body" >"$WORK/claim-body"
  # curl in the background, so that a signal interrupts the long-poll (the trap kills curl).
  curl -sS -o "$WORK/claim" -D "$WORK/headers" -w '%{http_code}' --max-time $((WAIT + 10)) \
    -H 'Content-Type: application/json' "${AUTH[@]}" --data-binary "@$WORK/claim-body" "$BASE/queues/$QUEUE/claim" \
    >"$WORK/claim-status" 2>/dev/null &
  CLAIMING=$!
  wait "$CLAIMING"
  wait "$CLAIMING" 2>/dev/null # after a signal: until curl has really ended
  CLAIMING=
  status=$(cat "$WORK/claim-status" 2>/dev/null)
  # A signal as the answer came in: a job in that answer is in hand (the server counts it delivered), so
  # it is run before stopping; an interrupted long-poll is released by the server.
  [[ -n $STOP && ${status:-000} != 200 ]] && break
  case ${status:-000} in
    200)
      if [[ -n $HANDIN ]]; then
        log "job $HANDIN: complete (on the claim) -> $(handed_in "$WORK/claim")"
        HANDIN=
      fi
      ;;
    422)
      if [[ -n $HANDIN ]] && grep -q '"complete"' "$WORK/claim"; then
        # The server refused the complete the claim carried (a result it cannot take), or does not take
        # completes on a claim at all (an older server): the job's own complete tells which.
        grep -q 'extra_forbidden' "$WORK/claim" && HAND_INS=
        send_handin
        continue
      fi
      log "claim refused ($status): $(cat "$WORK/claim")"
      send_handin
      exit 1
      ;;
    000 | 429 | 502 | 503 | 504)
      after=$(tr -d '\r' <"$WORK/headers" 2>/dev/null | awk -F': *' 'tolower($1) == "retry-after" { print $2 }')
      log "claim failed (${status:-000}); trying again in ${after:-1}s"
      sleep "${after:-1}"
      continue
      ;;
    *)
      log "claim refused ($status): $(cat "$WORK/claim")" # a bad key, queue name or setting
      send_handin
      exit 1
      ;;
  esac
  read -r id token attempts max_attempts < <(json_fields "$WORK/claim")
  if [[ -z ${id:-} ]]; then
    [[ -n $STOP || -n ${JOBQ_EXIT_WHEN_IDLE:-} ]] && break
    continue
  fi
  log "job $id: attempt $attempts of $max_attempts"
  run_job "$id" "$token" "$attempts" "$max_attempts" "$@"
done
send_handin # stopping with a result not yet handed in (or carried by a claim cut short): send it now
log "stopped"
