#!/usr/bin/env bash
# Builds clawmesh's release archives, reproducibly: the same commit and Go
# release give the same bytes. For each target, a static binary
# (CGO_ENABLED=0, -trimpath, no build id) with the version and revision
# stamped in (clawmesh version prints them), packed with the README into
# dist/clawmesh_VERSION_OS_ARCH.tar.gz (files sorted, owner root, times set
# to the commit's); then dist/checksums.txt (SHA-256) and dist/clawmesh.rb,
# the Homebrew formula rendered from packaging/homebrew/clawmesh.rb.tmpl.
#
#   scripts/release.sh v0.1.0              # all four targets
#   TARGETS=darwin/arm64 scripts/release.sh v0.1.0
#   BASE_URL=https://example.org/dl scripts/release.sh v0.1.0
#
# The version defaults to `git describe`; a tree with changes is stamped
# +dirty and is no release.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
case $version in v*) ;; *) version=v$version ;; esac
plain=${version#v}
revision=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  revision=$revision+dirty
fi
epoch=$(git log -1 --format=%ct)
targets=${TARGETS:-darwin/arm64 darwin/amd64 linux/arm64 linux/amd64}
out=${OUT:-dist}
base_url=${BASE_URL:-https://github.com/clawmesh/clawmesh/releases/download/$version}

rm -rf "$out"
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

for target in $targets; do
  goos=${target%/*}
  goarch=${target#*/}
  name=clawmesh_${plain}_${goos}_${goarch}
  echo "== $target"
  mkdir -p "$stage/$name"
  CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch GOFLAGS=-buildvcs=false \
    go build -trimpath \
      -ldflags "-s -w -buildid= -X main.version=$version -X main.revision=$revision" \
      -o "$stage/$name/clawmesh" ./cmd/clawmesh
  cp README.md "$stage/$name/"
  touch -d "@$epoch" "$stage/$name" "$stage/$name"/*
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=ustar \
    -C "$stage" -cf - "$name" | gzip -n -9 > "$out/$name.tar.gz"
done

(cd "$out" && sha256sum -- *.tar.gz > checksums.txt)
cat "$out/checksums.txt"

formula=$(sed -e "s|@VERSION@|$plain|g" -e "s|@BASE_URL@|$base_url|g" packaging/homebrew/clawmesh.rb.tmpl)
for target in darwin/arm64 darwin/amd64 linux/arm64 linux/amd64; do
  key=${target/\//_}
  sum=$(awk -v f="clawmesh_${plain}_${key}.tar.gz" '$2 == f { print $1 }' "$out/checksums.txt")
  formula=${formula//@SHA256_${key}@/${sum:-not built: run with TARGETS including $target}}
done
printf '%s\n' "$formula" > "$out/clawmesh.rb"
echo "== $out: $(ls "$out" | tr '\n' ' ')"
