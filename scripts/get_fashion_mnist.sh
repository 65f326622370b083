#!/usr/bin/env bash
# Obtain Fashion-MNIST the way a user would: already present -> done; Debian with root -> the
# `dataset-fashion-mnist` package; otherwise dpfl's checksum-verified official download.
set -euo pipefail
PY=${1:-python3}
if "$PY" -c "from dpfl.data import load_dataset; load_dataset('fashion_mnist')" >/dev/null 2>&1; then
  echo "Fashion-MNIST: found"
  exit 0
fi
if [ -f /etc/debian_version ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "Fashion-MNIST: installing Debian package dataset-fashion-mnist"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq dataset-fashion-mnist >/dev/null
  fi
else
  echo "Fashion-MNIST: downloading the official files"
  "$PY" -c "from dpfl.data import fetch; print(fetch('fashion_mnist'))"
fi
"$PY" -c "from dpfl.data import load_dataset; d = load_dataset('fashion_mnist'); print('Fashion-MNIST:', len(d.x_train), 'train /', len(d.x_test), 'test')"
