#!/usr/bin/env bash
# Installs what lily needs to build and test on Debian 12: the C libraries it
# links, clang for the fuzzers, python3-jinja2 for the chat-template oracle,
# and the npm packages that serve as test oracles (tests/npm).
set -euo pipefail
cd "$(dirname "$0")/.."
DEBS="build-essential pkg-config clang libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev
      libssl-dev libpcre2-dev libutf8proc-dev curl"
missing=""
for p in $DEBS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# Tools may come from elsewhere (a NodeSource nodejs bundles npm and conflicts with Debian's
# npm; python3 may be a pyenv build with its own jinja2): install only what is absent.
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
python3 -c 'import jinja2' >/dev/null 2>&1 || missing="$missing python3-jinja2"
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# python3 may be a non-Debian build without the Debian jinja2 module on its path.
python3 -c 'import jinja2' 2>/dev/null || echo "setup: warning: python3 cannot import jinja2; template differential tests will fail" >&2
if [ -f tests/npm/package.json ]; then
  (cd tests/npm && { [ -d node_modules ] && npm ls >/dev/null 2>&1 || npm install --no-audit --no-fund --loglevel=error; })
fi
echo "setup: ok"
