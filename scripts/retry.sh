# Sourced by .ci/run and scripts/make_vllm_venv.sh: `retry CMD...` runs CMD up to 3 times, 30 s
# and 60 s apart (RETRY_DELAY_S sets the first wait; the second is twice it). A download the
# network cuts (pip gives up after its own resume attempts, all at the same byte) then costs a
# minute instead of the whole CI run; a command that fails for any other reason fails three
# times, and its last exit status is returned.
retry() {
  local attempt rc=0 delay="${RETRY_DELAY_S:-30}"
  for attempt in 1 2 3; do
    "$@" && return 0
    rc=$?
    if [[ $attempt -lt 3 ]]; then
      echo "retry: '$*' exited $rc (attempt $attempt of 3); again in $((attempt * delay)) s" >&2
      sleep $((attempt * delay))
    fi
  done
  return "$rc"
}
