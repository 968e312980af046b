#!/usr/bin/env bash
# 60-nvidia: optional NVIDIA driver (a pinned branch from NVIDIA's CUDA repository), with
# what the big instances need: Fabric Manager of the driver's branch (NVSwitch instance
# types p4d, p4de, p5, p5e, p5en, p6-b200 cannot use their GPUs without it; it runs only
# where NVSwitches are), with branch 570 and later NVLSM and ib_umad for NVLink 5
# (p6-b200), nvidia-persistenced, and the /dev/nvidia* device nodes created (nvidia-modprobe)
# before slurmd starts; DCGM when NVIDIA_DCGM=true.
set -Eeuo pipefail
STEP=60-nvidia
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

if [ -z "${NVIDIA_DRIVER_VERSION:-}" ]; then
	[ "${NVIDIA_DCGM:-false}" != true ] || die "nvidia_dcgm = true needs nvidia_driver_version"
	log "nvidia_driver_version is empty: NVIDIA driver and DCGM left out of this image"
	exit 0
fi
NAME="NVIDIA CUDA repository"
branch=${NVIDIA_DRIVER_VERSION%%.*}
# An exact version (branch.minor[.patch]) pins the driver and Fabric Manager to it; a bare
# branch (550) takes the branch's newest of both.
exact=
case $NVIDIA_DRIVER_VERSION in
*.*) exact=$NVIDIA_DRIVER_VERSION ;;
esac
case ${IMAGE_ARCH:-x86_64} in
x86_64) narch=x86_64 ;;
arm64) narch=sbsa ;;
*) die "unknown architecture '${IMAGE_ARCH}'" ;;
esac
case ${IMAGE_OS:-} in
ubuntu-22.04) repo=https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/$narch ;;
ubuntu-24.04) repo=https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/$narch ;;
al2023) repo=https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/$narch ;;
rocky9) repo=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/$narch ;;
*) die "no NVIDIA repository known for ${IMAGE_OS:-this OS}: set nvidia_driver_version = \"\"" ;;
esac

if command -v nvidia-smi >/dev/null 2>&1 && [ -f /etc/slurm-image/nvidia-branch ] && [ "$(cat /etc/slurm-image/nvidia-branch)" = "$branch" ]; then
	log "NVIDIA driver branch $branch already installed"
else
	if ! probe "$repo/"; then
		unreachable "$NAME" "$repo/"
		exit 0
	fi
	if [ "$(os_family)" = deb ]; then
		if [ ! -f /usr/share/keyrings/cuda-archive-keyring.gpg ]; then
			keyring=/var/cache/slurm-image/cuda-keyring.deb
			mkdir -p "$(dirname "$keyring")"
			curl -fsSL -o "$keyring" "$repo/cuda-keyring_1.1-1_all.deb"
			pkg_run "installing the CUDA repository keyring" dpkg -i "$keyring"
		fi
		pkg_install "linux-headers-$(uname -r)"
		# Fabric Manager and the driver from the same branch of the same repository; with an
		# exact version (550.127.05), both at that version (apt's `pkg=version` with the
		# packaging revision left open), held so that no upgrade moves one without the other:
		# a Fabric Manager of another version than the driver refuses to start, and the
		# NVSwitch GPUs are then unusable.
		if [ -n "$exact" ]; then
			pkg_install "nvidia-driver-$branch-server-open=$exact-*" "nvidia-fabricmanager-$branch=$exact-*" nvidia-modprobe
			pkg_run "holding the NVIDIA driver and Fabric Manager at $exact" apt-mark hold "nvidia-driver-$branch-server-open" "nvidia-fabricmanager-$branch"
		else
			pkg_install "nvidia-driver-$branch-server-open" "nvidia-fabricmanager-$branch" nvidia-modprobe
		fi
	else
		pkg_install dnf-plugins-core "kernel-devel-$(uname -r)"
		compgen -G "/etc/yum.repos.d/cuda-*.repo" >/dev/null || dnf config-manager --add-repo "$repo/cuda-$(basename "$(dirname "$repo")").repo"
		# The module stream pins the driver branch; Fabric Manager and nvidia-persistenced
		# come from the same stream, so their versions match the driver's.
		pkg_run "installing the NVIDIA driver $branch" dnf_cmd module install -y -q "nvidia-driver:$branch-open"
		if [ -n "$exact" ]; then
			pkg_install "nvidia-fabric-manager-$exact" nvidia-persistenced nvidia-modprobe python3-dnf-plugin-versionlock
			pkg_run "holding the NVIDIA driver and Fabric Manager at $exact" dnf_cmd versionlock add "nvidia-driver-$exact" "nvidia-fabric-manager-$exact"
		else
			pkg_install nvidia-fabric-manager nvidia-persistenced nvidia-modprobe
		fi
	fi
	mkdir -p /etc/slurm-image
	echo "$branch" >/etc/slurm-image/nvidia-branch
	[ -z "$exact" ] || echo "$exact" >/etc/slurm-image/nvidia-version
fi

# NVLink 5 (HGX B200, p6-b200): Fabric Manager starts NVLSM, the NVLink subnet manager,
# which programs the NVSwitches through the InfiniBand stack and needs ib_umad; without
# them Fabric Manager exits and every GPU's fabric state stays "In Progress" (CUDA error
# 802; NVIDIA/gpu-operator #2781, Ubuntu AMIs without linux-modules-extra). The image is
# not built for one instance type, so every image with a driver branch that supports
# Blackwell (570 and later) gets them: ib_umad loaded at boot is harmless elsewhere, and
# Fabric Manager's start script starts NVLSM only on NVLink 5 systems.
if [ "$branch" -ge 570 ]; then
	if [ "$(os_family)" = deb ]; then
		# ib_umad and mlx5_ib ship in linux-modules-extra on Ubuntu's kernels.
		pkg_install "linux-modules-extra-$(uname -r)" nvlsm
	else
		pkg_install nvlsm
	fi
	write_if_changed /etc/modules-load.d/nvidia-fabric.conf 0644 <<'EOS'
# NVIDIA Fabric Manager on NVLink 5 systems (HGX B200, p6-b200) runs NVLSM, which needs
# ib_umad (packer/scripts/60-nvidia.sh).
ib_umad
EOS
	log "NVLink 5 prerequisites: nvlsm installed, ib_umad loaded at boot (/etc/modules-load.d/nvidia-fabric.conf)"
fi

# Device nodes before slurmd: slurmd (and the agent's GPU count) need /dev/nvidia<N>,
# /dev/nvidiactl and /dev/nvidia-uvm, which the driver creates only on first use.
write_if_changed "$IMAGE_LIB_DIR/nvidia-device-nodes" 0755 <<'EOS'
#!/bin/sh
# Create the NVIDIA device nodes (packer/scripts/60-nvidia.sh): one per GPU, the control
# node and UVM. Run by nvidia-device-nodes.service before slurmd.
set -eu
nvidia-modprobe
n=0
for gpu in /proc/driver/nvidia/gpus/*; do
	[ -e "$gpu" ] || continue
	nvidia-modprobe -c "$n"
	n=$((n + 1))
done
nvidia-modprobe -u -c 0
echo "nvidia-device-nodes: $n GPU device node(s), nvidiactl and nvidia-uvm present"
EOS
write_if_changed /etc/systemd/system/nvidia-device-nodes.service 0644 <<UNIT
[Unit]
Description=Create the NVIDIA device nodes before slurmd
Before=slurmd.service slurm-node-agent-bootstrap.service
After=systemd-modules-load.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$IMAGE_LIB_DIR/nvidia-device-nodes

[Install]
WantedBy=multi-user.target slurmd.service
UNIT
# Fabric Manager only where NVSwitches are (its service fails elsewhere).
write_if_changed /etc/systemd/system/nvidia-fabricmanager.service.d/slurm-image.conf 0644 <<'UNIT'
[Unit]
Before=slurmd.service
[Service]
ExecCondition=/bin/sh -c 'ls /proc/driver/nvidia-nvswitch/devices/* >/dev/null 2>&1'
UNIT
systemctl enable nvidia-persistenced.service nvidia-fabricmanager.service nvidia-device-nodes.service >/dev/null
log "Fabric Manager (NVSwitch instances only), nvidia-persistenced and nvidia-device-nodes enabled"

if [ "${NVIDIA_DCGM:-false}" = true ]; then
	pkg_install datacenter-gpu-manager
	systemctl enable nvidia-dcgm.service >/dev/null 2>&1 || systemctl enable dcgm.service >/dev/null
fi
clear_skip "$NAME"
log "done"
