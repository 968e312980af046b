#!/usr/bin/env bash
# 80-hardening: SSH without passwords or root logins, a locked root password, kernel
# settings that hide kernel addresses and logs from users, and core dumps off for setuid
# programs. Nothing here touches what HPC jobs need (ptrace within a job, RDMA, memlock).
set -Eeuo pipefail
STEP=80-hardening
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

if [ -d /etc/ssh ]; then
	write_if_changed /etc/ssh/sshd_config.d/50-slurm-node.conf 0644 <<'CONF'
# packer/scripts/80-hardening.sh
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
X11Forwarding no
CONF
	if [ -f /etc/ssh/sshd_config ] && ! grep -qE '^\s*Include\s+/etc/ssh/sshd_config.d/\*\.conf' /etc/ssh/sshd_config; then
		sed -i '1i Include /etc/ssh/sshd_config.d/*.conf' /etc/ssh/sshd_config
	fi
else
	log "no /etc/ssh: SSH settings not needed"
fi

write_if_changed /etc/sysctl.d/90-slurm-node.conf 0644 <<'CONF'
# packer/scripts/80-hardening.sh
kernel.kptr_restrict = 2
kernel.dmesg_restrict = 1
fs.protected_hardlinks = 1
fs.protected_symlinks = 1
fs.suid_dumpable = 0
net.ipv4.conf.all.accept_redirects = 0
net.ipv4.conf.default.accept_redirects = 0
net.ipv4.conf.all.send_redirects = 0
CONF

# Lock root's password (keys and sudo stay the way in); idempotent.
if [ "$(passwd -S root 2>/dev/null | awk '{print $2}')" != L ]; then
	usermod -L root
fi

write_if_changed /etc/security/limits.d/90-slurm-node-core.conf 0644 <<'CONF'
# packer/scripts/80-hardening.sh: no core dumps by default (jobs may raise the soft limit).
*    soft    core    0
CONF
log "done"
