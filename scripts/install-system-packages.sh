#!/usr/bin/env bash
# Debian packages the test suite's `ray up` leg needs beside the Python stack (tests/test_cluster.py): an SSH server
# for each node Ray's local provider logs into, and the ssh and rsync its command runner calls. Installs only what
# is missing, with apt-get, as root (CI runs as root); elsewhere prints what to install and exits 0: that leg then
# skips with the reason. Touches nothing else: no sshd is started or enabled here.
set -euo pipefail
missing=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
if [ "${#missing[@]}" -eq 0 ]; then
    echo "system packages: all present (openssh-server, openssh-client, rsync)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system packages: missing ${missing[*]}; install them (as root, with your package manager) for the ray up test"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the package's own sshd service unstarted where a service manager would start it
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
echo "system packages: installed ${missing[*]}"
