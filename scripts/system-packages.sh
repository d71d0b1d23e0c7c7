#!/bin/sh
# Best effort: the system packages laneflow can use but never needs to run.
# - bubblewrap gives a step's programs (bash, script tools) namespaces with no network;
#   without it they run as plain subprocesses with a scrubbed environment, and the step's
#   trace says so.
# - chromium (Debian's) is the headless browser of tests/browser, driven by Playwright's
#   Python package; without it those tests are skipped, saying so.
# Installs what is missing with apt-get when running as root on a machine with apt;
# otherwise says what it skipped, one line each, and succeeds.
install() {  # install PACKAGE: 0 when apt-get installed it
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null 2>&1; }
}
if ! command -v bwrap >/dev/null 2>&1; then
    if install bubblewrap; then
        echo "system-packages: installed bubblewrap"
    else
        echo "system-packages: bubblewrap not installed (needs root and apt-get); programs will run as plain subprocesses"
    fi
fi
if [ ! -x /usr/bin/chromium ]; then
    if install chromium; then
        echo "system-packages: installed chromium"
    else
        echo "system-packages: chromium not installed (needs root and apt-get); tests/browser will be skipped"
    fi
fi
exit 0
