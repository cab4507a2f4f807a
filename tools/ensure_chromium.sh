#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium for the browser tests (tests/browser/).
#
#   bash tools/ensure_chromium.sh      # `make test` runs this; so does `make browser-test`
#
# It installs the `chromium` package with apt-get where it is missing and this runs as root
# (or with passwordless sudo) on a Debian/Ubuntu machine. It never downloads a browser build of
# its own (no `playwright install`). Where Chromium cannot be installed it says why and exits 0:
# the browser tests then skip with a clear message, and the rest of the suite still runs.
# Set CHROMIUM=/path/to/chromium to use another Chromium or Chrome binary.
set -u

chromium="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$chromium" ]; then
    echo "ensure_chromium: found $("$chromium" --version 2>/dev/null || echo "$chromium")"
    exit 0
fi

say_skip() {
    echo "ensure_chromium: $1"
    echo "ensure_chromium: the browser tests (tests/browser/) will be SKIPPED."
    echo "ensure_chromium: to run them, install Debian's Chromium: sudo apt-get install -y chromium"
    exit 0
}

command -v apt-get >/dev/null 2>&1 || say_skip "no apt-get on this machine, so Chromium cannot be installed here."

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    say_skip "not root and no passwordless sudo, so apt-get cannot install Chromium."
fi

echo "ensure_chromium: installing Debian's chromium with apt-get (once; about a minute)"
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get install -y -q --no-install-recommends chromium >/tmp/ensure_chromium.log 2>&1; then
    # The package lists may be missing or stale on a fresh machine: update once, then retry.
    "${as_root[@]}" apt-get update -q >>/tmp/ensure_chromium.log 2>&1 || true
    if ! "${as_root[@]}" apt-get install -y -q --no-install-recommends chromium >>/tmp/ensure_chromium.log 2>&1; then
        tail -n 5 /tmp/ensure_chromium.log
        say_skip "apt-get could not install chromium (log: /tmp/ensure_chromium.log)."
    fi
fi
if [ -x /usr/bin/chromium ]; then
    echo "ensure_chromium: installed $(/usr/bin/chromium --version 2>/dev/null)"
else
    say_skip "apt-get ran, but /usr/bin/chromium is still missing."
fi
