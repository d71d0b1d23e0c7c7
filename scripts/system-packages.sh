#!/bin/sh
# Best effort: the system packages laneflow can use but never needs. bubblewrap gives a
# step's programs (bash, script tools) namespaces with no network; without it they run as
# plain subprocesses with a scrubbed environment, and the step's trace says so.
# Installs Debian's bubblewrap with apt-get when running as root on a machine with apt;
# otherwise says what it skipped, in one line, and succeeds.
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 ||
       { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1; }; then
        echo "system-packages: installed bubblewrap"
        exit 0
    fi
fi
echo "system-packages: bubblewrap not installed (needs root and apt-get); programs will run as plain subprocesses"
exit 0
