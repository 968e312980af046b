#!/usr/bin/env bash
# 60-nvidia: optional NVIDIA driver (a pinned branch from NVIDIA's CUDA repository) and DCGM.
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
			curl -fsSL -o "$keyring" "$repo/cuda-keyring_1.1-1_all.deb"
			dpkg -i "$keyring"
		fi
		pkg_install "linux-headers-$(uname -r)"
		pkg_install "nvidia-driver-$branch-server-open" "nvidia-fabricmanager-$branch"
	else
		pkg_install dnf-plugins-core "kernel-devel-$(uname -r)"
		compgen -G "/etc/yum.repos.d/cuda-*.repo" >/dev/null || dnf config-manager --add-repo "$repo/cuda-$(basename "$(dirname "$repo")").repo"
		dnf module install -y -q "nvidia-driver:$branch-open"
	fi
	mkdir -p /etc/slurm-image
	echo "$branch" >/etc/slurm-image/nvidia-branch
fi

if [ "${NVIDIA_DCGM:-false}" = true ]; then
	pkg_install datacenter-gpu-manager
	systemctl enable nvidia-dcgm.service >/dev/null 2>&1 || systemctl enable dcgm.service >/dev/null
fi
clear_skip "$NAME"
log "done"
