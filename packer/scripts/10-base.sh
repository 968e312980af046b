#!/usr/bin/env bash
# 10-base: base packages, the image's build record and tools, and a hold on the kernel so
# that later package updates cannot leave modules (Lustre, EFA, NVIDIA) behind.
set -Eeuo pipefail
STEP=10-base
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

: "${IMAGE_OS:?IMAGE_OS is not set: pass the os variable (slurm-image-builder does)}"
: "${SLURM_VERSION:?SLURM_VERSION is not set: pass the slurm_version variable}"

# The build record: what the acceptance checks compare against, on demand too.
write_if_changed "$BUILD_INFO" 0644 <<INFO
# Written by packer/scripts/10-base.sh; read by the acceptance checks.
IMAGE_OS=$IMAGE_OS
IMAGE_ARCH=${IMAGE_ARCH:-}
SLURM_VERSION=$SLURM_VERSION
SLURM_VERSIONS=${SLURM_VERSIONS:-$SLURM_VERSION}
SLURM_DEFAULT=${SLURM_DEFAULT:-$SLURM_VERSION}
SLURM_SOURCE=${SLURM_SOURCE:-tarball}
SLURM_AUTH=${SLURM_AUTH:-munge}
EFA_INSTALLER_VERSION=${EFA_INSTALLER_VERSION:-}
LUSTRE_CLIENT=${LUSTRE_CLIENT:-false}
NVIDIA_DRIVER_VERSION=${NVIDIA_DRIVER_VERSION:-}
NVIDIA_DCGM=${NVIDIA_DCGM:-false}
CLOUDWATCH_AGENT=${CLOUDWATCH_AGENT:-false}
AGENT_VERSION=${AGENT_VERSION:-}
INFO

# The helpers and the acceptance checks stay in the image: `slurm-image-acceptance`.
src_dir=$(dirname "$lib")
for f in lib.sh 99-acceptance.sh; do
	[ -r "$src_dir/$f" ] || die "$src_dir/$f is missing: upload the whole packer/scripts folder to $IMAGE_STAGING/scripts"
	write_if_changed "$IMAGE_LIB_DIR/$f" 0755 <"$src_dir/$f"
done
write_if_changed /usr/local/sbin/slurm-image-acceptance 0755 <<'EOS'
#!/bin/sh
# Runs the image acceptance checks (packer/scripts/99-acceptance.sh) on demand.
exec bash /usr/local/lib/slurm-image/99-acceptance.sh "$@"
EOS

# dbus: the system bus, through which the agent and systemctl reach systemd. btrfs-progs:
# node-local scratch striped over the instance store disks (the agent's [scratch]; RHEL 9
# and Amazon Linux 2023 ship no btrfs, and 70-agent.sh turns scratch off there).
if [ "$(os_family)" = deb ]; then
	pkg_install ca-certificates curl tar bzip2 gzip xz-utils procps kmod systemd util-linux dbus btrfs-progs
else
	pkg_install ca-certificates tar bzip2 gzip xz procps-ng kmod systemd util-linux dbus
	command -v curl >/dev/null 2>&1 || pkg_install curl-minimal
fi

# Package updates on a running node: a node changes by a new image (a rolling upgrade), not
# by updates in place. A restart of slurmd kills and requeues the jobs it runs (Ubuntu's
# unattended upgrades updated glibc and needrestart restarted slurmd), and cloud-init's
# first-boot update failed on the dpkg lock. So: apt waits for the lock instead of failing,
# no automatic upgrades or list updates (read after Ubuntu's 20auto-upgrades, which turns
# them on), and needrestart, where it is installed, never restarts the node's daemons.
if [ "$(os_family)" = deb ]; then
	write_if_changed /etc/apt/apt.conf.d/90slurm-node 0644 <<'CONF'
// packer/scripts/10-base.sh: a Slurm node changes by a new image, not by updates in place.
// Wait for the package lock (cloud-init's first-boot update, an operator) instead of failing.
DPkg::Lock::Timeout "600";
// No automatic upgrades: a restarted slurmd kills and requeues the jobs it runs.
APT::Periodic::Unattended-Upgrade "0";
APT::Periodic::Update-Package-Lists "0";
CONF
	write_if_changed /etc/needrestart/conf.d/50-slurm-node.conf 0644 <<'CONF'
# packer/scripts/10-base.sh: needrestart (run by apt after an update) never restarts the
# daemons of a Slurm node: restarting slurmd kills and requeues the jobs it runs, and the
# agent, munge and sackd hold the node's place in the cluster. A new image replaces them.
$nrconf{override_rc}->{qr(^slurmd\.service$)} = 0;
$nrconf{override_rc}->{qr(^sackd\.service$)} = 0;
$nrconf{override_rc}->{qr(^munge\.service$)} = 0;
$nrconf{override_rc}->{qr(^slurm-node-agent(-[a-z]+)?\.service$)} = 0;
CONF
else
	# dnf has no automatic updates unless dnf-automatic's timers run: masked where present.
	for t in dnf-automatic.timer dnf-automatic-install.timer dnf-automatic-notifyonly.timer; do
		if systemctl list-unit-files "$t" 2>/dev/null | grep -q "^$t"; then
			systemctl mask "$t" >/dev/null 2>&1 || true
			log "$t masked: no automatic updates on a node"
		fi
	done
fi

# Kernel hold.
if [ "$(os_family)" = deb ]; then
	kernels=$(dpkg-query -W -f='${Package} ${Status}\n' 'linux-image-*' 2>/dev/null | awk '/install ok installed/ {print $1}' || true)
	if [ -z "$kernels" ]; then
		log "no kernel package installed (a chroot or container root): nothing to hold"
	else
		held=$(apt-mark showhold)
		for k in $kernels; do
			grep -qxF "$k" <<<"$held" || apt-mark hold "$k" >/dev/null
		done
		log "kernel packages held: $(echo "$kernels" | tr '\n' ' ')"
	fi
else
	# Only the kernel itself: kernel-devel of the running version stays installable (DKMS).
	if ! grep -qs '^exclude=kernel kernel-core kernel-modules' /etc/dnf/dnf.conf; then
		printf 'exclude=kernel kernel-core kernel-modules kernel-modules-extra\n' >>/etc/dnf/dnf.conf
	fi
	log "kernel packages excluded from dnf updates"
fi
log "done"
