#!/bin/sh
# Refresh the run viewer's vendored libraries from the npm registry (needs npm; a developer's
# step, never a test's): scripts/vendor_viewer.sh [PREACT_VERSION] [HTM_VERSION]. Then write
# the versions and the printed sha256 sums into the vendor folder's VENDORED.md.
set -eu
PREACT=${1:-11.2.0}
HTM=${2:-3.1.1}
dest=$(cd "$(dirname "$0")/.." && pwd)/layers/laneflow/laneflow/entrypoints/api/viewer/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "preact@$PREACT" "htm@$HTM" >/dev/null
mkdir p h
tar xzf "preact-$PREACT.tgz" -C p
tar xzf "htm-$HTM.tgz" -C h
cp p/package/dist/preact.mjs "$dest/preact.mjs"
cp p/package/hooks/dist/hooks.mjs "$dest/preact-hooks.mjs"
cp p/package/LICENSE "$dest/LICENSE-preact.txt"
cp h/package/dist/htm.mjs "$dest/htm.mjs"
cp h/package/LICENSE "$dest/LICENSE-htm.txt"
cd "$dest" && sha256sum preact.mjs preact-hooks.mjs htm.mjs
