#!/bin/sh
# make engine: the Pulumi CLI (from its Go module, pinned by engine/cli/go.mod + go.sum), this
# project's Python language host (engine/langhost) and the Docker provider (engine/docker: the Terraform
# Docker provider's module behind the Terraform bridge), built once per machine into
# ${QWEN35_CACHE:-~/.cache/qwen35-spark}/engine/<versions>/bin, with the two scripts the language host
# and dynamic providers need from the sdk/v3 module beside them. Reused while the versions and our
# sources are unchanged. The last line names the folder: `engine: bin=<dir>`.
#
# A `pulumi` already on PATH (an operator's laptop) at the pinned release or newer is used instead,
# with the language host and scripts it ships; the Docker provider is still built here:
# `engine: bin=<folder> (pulumi on PATH: <path>)`.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cache=${QWEN35_CACHE:-$HOME/.cache/qwen35-spark}/engine

# The release pinned by the wrapper module (the CLI and the SDK the language host builds on).
version=$(awk '$1 == "github.com/pulumi/pulumi/pkg/v3" { print $2; exit }' "$here/cli/go.mod")
[ -n "$version" ] || { echo "engine: no pkg/v3 requirement in engine/cli/go.mod" >&2; exit 1; }

# The Terraform Docker provider's module, at the commit the module proxy serves nearest to what
# pulumi-docker 5.2.0 wraps (v4.6.0, 2026-09-01; the proxy refuses every commit from v4.4.0 on that
# it was asked for, and serves this one of 2026-09-16, whose CHANGELOG ends at v4.6.0), checked
# against this sum. docs/engine.md lists what changed for the properties the program sets.
upstream_module=github.com/kreuzwerker/terraform-provider-docker
upstream_version=v0.0.0-20260916201441-96d331c98ff4
upstream_sum=h1:T3HvvZCRd4h2qkMl+SXA2zza26Rdz8xqV81skikQWy4=

ours_hash=$(cat "$here/langhost/main.go" "$here/langhost/go.mod" "$here/langhost/go.sum" \
  "$here/docker/main.go" "$here/docker/go.mod" "$here/docker/go.sum" "$here/docker/shim/shim.go.in" \
  | sha256sum | cut -c1-12)

onpath=""
if [ "${QWEN35_ENGINE_FROM_PATH:-1}" = 1 ] && command -v pulumi >/dev/null 2>&1; then
  candidate=$(command -v pulumi)
  have=$(pulumi version 2>/dev/null || true)
  # sort -V: the newer of the two versions sorts last.
  newest=$(printf '%s\n%s\n' "$version" "$have" | sort -V | tail -1)
  if [ -n "$have" ] && [ "$newest" = "$have" ] && [ -x "$(dirname "$candidate")/pulumi-language-python" ]; then
    onpath=$candidate
    echo "engine: using pulumi $have at $onpath (on PATH; pinned $version or newer)"
  else
    echo "engine: pulumi on PATH ($candidate, '${have:-no version}') is older than $version or lacks pulumi-language-python: building"
  fi
fi

if [ -n "$onpath" ]; then
  key=onpath-docker-$ours_hash
else
  key=pulumi-$version-ours-$ours_hash
fi
bin=$cache/$key/bin
if [ -f "$cache/$key/.complete" ]; then
  echo "engine: cached: $cache/$key ($(cat "$cache/$key/.complete"))"
  echo "engine: bin=$bin${onpath:+ (pulumi on PATH: $onpath)}"
  exit 0
fi

command -v go >/dev/null 2>&1 || {
  echo "engine: install Go 1.26+ (https://go.dev/dl) to build the Pulumi CLI from its Go module, or put a pulumi $version+ on PATH" >&2
  exit 1
}

start=$(date +%s)
tmp=$cache/.building-$$
rm -rf "$tmp"
mkdir -p "$tmp/bin"
trap 'rm -rf "$tmp"' EXIT
# CGO off and these tags: how Pulumi's own release builds the CLI (a static binary, no tracing of gRPC).
if [ -n "$onpath" ]; then
  ln -s "$onpath" "$tmp/bin/pulumi"
  for script in pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python; do
    [ -e "$(dirname "$onpath")/$script" ] && ln -s "$(dirname "$onpath")/$script" "$tmp/bin/$script"
  done
else
  echo "engine: building pulumi $version from github.com/pulumi/pulumi/pkg/v3 (a cold build takes minutes)"
  (cd "$here/cli" && CGO_ENABLED=0 go build -trimpath -tags osusergo,grpcnotrace \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$version" \
    -o "$tmp/bin/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
  echo "engine: building pulumi-language-python (engine/langhost)"
  (cd "$here/langhost" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X main.version=$version-qwen35.$ours_hash" \
    -o "$tmp/bin/pulumi-language-python" .)
  # The executor and the dynamic-provider host are scripts in the sdk/v3 module; the module cache
  # keeps them read-only and without their run bit.
  sdk=$(cd "$here/langhost" && go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)
  install -m 755 "$sdk/python/cmd/pulumi-language-python-exec" "$tmp/bin/pulumi-language-python-exec"
  install -m 755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$tmp/bin/pulumi-resource-pulumi-python"
fi

# The Docker provider: the upstream module copied out of the module cache into a build folder (the
# cache is read-only), our shim added (Go keeps internal/provider private to that module), built there.
echo "engine: building pulumi-resource-docker (engine/docker: $upstream_module@$upstream_version)"
info=$(cd "$here/docker" && go mod download -json "$upstream_module@$upstream_version")
got_sum=$(printf '%s\n' "$info" | awk -F'"' '$2 == "Sum" { print $4 }')
[ "$got_sum" = "$upstream_sum" ] || {
  echo "engine: $upstream_module@$upstream_version has sum '$got_sum', not the pinned $upstream_sum" >&2
  exit 1
}
upstream_dir=$(printf '%s\n' "$info" | awk -F'"' '$2 == "Dir" { print $4 }')
src=$tmp/docker-src
mkdir -p "$src"
cp "$here/docker/main.go" "$here/docker/go.mod" "$here/docker/go.sum" "$src/"
cp -R "$upstream_dir" "$src/upstream"
chmod -R u+w "$src/upstream"
mkdir -p "$src/upstream/shim"
cp "$here/docker/shim/shim.go.in" "$src/upstream/shim/shim.go"
(cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/bin/pulumi-resource-docker" .)
rm -rf "$src"

"$tmp/bin/pulumi" version >/dev/null
size=$(du -sh "$tmp/bin" | cut -f1)
seconds=$(( $(date +%s) - start ))
echo "built in ${seconds}s, $size" > "$tmp/.complete"
rm -rf "${cache:?}/$key"
mv "$tmp" "$cache/$key"
trap - EXIT
echo "engine: built $cache/$key in ${seconds}s ($size)"
echo "engine: bin=$bin${onpath:+ (pulumi on PATH: $onpath)}"
