#!/bin/sh
# Builds the built-in reward plugins into builtin/<name>.wasm.gz, reproducibly
# (the module is what is reproducible; the comparison is on the module, so the
# gzip implementation does not matter).
#
#   wasm-rewards/build.sh           rebuild and overwrite the committed modules
#   wasm-rewards/build.sh --check   rebuild into a temporary directory and fail
#                                   if any differs from the committed module
#
# The modules are only byte-identical when built by the Go release recorded in
# builtin/GOVERSION; --check with another release reports the mismatch.
set -eu
cd "$(dirname "$0")"
check=0
[ "${1:-}" = "--check" ] && check=1

want=$(cat builtin/GOVERSION 2>/dev/null || true)
have=$(go env GOVERSION)
if [ $check = 1 ] && [ "$want" != "$have" ]; then
	echo "build.sh: builtin/*.wasm.gz were built with $want, this is $have; cannot compare" >&2
	exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

status=0
for dir in builtin/*/; do
	name=$(basename "$dir")
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
		go build -buildmode=c-shared -trimpath -ldflags='-s -w -buildid=' -o "$out/$name.wasm" "./$dir"
	if [ $check = 1 ]; then
		if gzip -dc "builtin/$name.wasm.gz" | cmp -s "$out/$name.wasm" -; then
			echo "ok    $name"
		else
			echo "DIFF  $name: builtin/$name.wasm.gz does not match its source; run wasm-rewards/build.sh" >&2
			status=1
		fi
	else
		gzip -n -9 -c "$out/$name.wasm" > "builtin/$name.wasm.gz"
		echo "built builtin/$name.wasm.gz"
	fi
done
[ $check = 1 ] || echo "$have" > builtin/GOVERSION
exit $status
