#!/usr/bin/env bash
# 90-cleanup: leave nothing that belongs to the build instance or would be shared by every
# node: SSH host keys, machine-id, cloud-init state, the munge key, shell history, logs,
# package caches and the staging folder. 99-acceptance.sh checks the same list.
set -Eeuo pipefail
STEP=90-cleanup
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

rm -f /etc/ssh/ssh_host_*
# An empty machine-id makes systemd generate a new one at first boot.
if [ -e /etc/machine-id ] && [ -s /etc/machine-id ]; then
	: >/etc/machine-id
fi
[ -L /var/lib/dbus/machine-id ] || rm -f /var/lib/dbus/machine-id
rm -f /var/lib/systemd/random-seed
rm -f /etc/munge/munge.key /etc/slurm/slurm.key
if command -v cloud-init >/dev/null 2>&1; then
	cloud-init clean --logs --seed >/dev/null
fi
rm -rf /var/lib/cloud/instances /var/lib/cloud/instance /var/lib/cloud/data /var/lib/cloud/sem
rm -f /root/.bash_history /home/*/.bash_history /root/.lesshst /root/.viminfo /root/.wget-hsts

if [ "$(os_family)" = deb ]; then
	apt-get clean
	find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name lock ! -name partial -exec rm -rf {} +
else
	dnf clean all -q >/dev/null 2>&1 || true
fi
rm -rf /var/cache/slurm-image /var/tmp/slurm-build.* /var/tmp/munge-build.* /var/tmp/efa.*

# Logs: rotated ones removed, live ones emptied (services keep their open files).
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
find /var/log -type f -size +0c -exec truncate -s 0 {} +
rm -rf /var/log/journal/*

case $IMAGE_STAGING in
/tmp/* | /var/tmp/*) rm -rf "$IMAGE_STAGING" ;;
*) log "staging folder $IMAGE_STAGING left in place (not under /tmp)" ;;
esac
log "done"
