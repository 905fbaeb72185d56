# Sourced by the CI stage scripts: run_tests runs a pytest command line and fails the stage on any
# failure, and when it collected nothing (pytest's exit status 5).
run_tests() {
  set +e
  "$@"
  local status=$?
  set -e
  if [ "$status" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
  [ "$status" -eq 0 ] || exit "$status"
}
