#!/usr/bin/env bash
# 50-lustre: the FSx for Lustre client, with a module for every installed kernel.
# Amazon Linux 2023 ships it; Ubuntu and Rocky use AWS's FSx Lustre client repositories.
set -Eeuo pipefail
STEP=50-lustre
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

REPO=https://fsx-lustre-client-repo.s3.amazonaws.com
NAME="FSx Lustre client repository"
if [ "${LUSTRE_CLIENT:-false}" != true ]; then
	log "lustre_client is false: Lustre client left out of this image"
	exit 0
fi

case ${IMAGE_OS:-} in
al2023)
	pkg_install lustre-client
	;;
ubuntu-22.04 | ubuntu-24.04)
	key_url=$REPO/ubuntu/fsx-ubuntu-public-key.asc
	if ! probe "$key_url"; then
		unreachable "$NAME" "$key_url"
		exit 0
	fi
	if [ ! -s /usr/share/keyrings/fsx-ubuntu-public-key.gpg ]; then
		pkg_install gnupg
		curl -fsSL "$key_url" | gpg --dearmor >/usr/share/keyrings/fsx-ubuntu-public-key.gpg.tmp
		mv -f /usr/share/keyrings/fsx-ubuntu-public-key.gpg.tmp /usr/share/keyrings/fsx-ubuntu-public-key.gpg
	fi
	codename=$(sed -n "s/^VERSION_CODENAME=//p" /etc/os-release)
	write_if_changed /etc/apt/sources.list.d/fsxlustreclientrepo.list 0644 <<LIST
deb [signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.gpg] $REPO/ubuntu $codename main
LIST
	pkgs=()
	for k in $(installed_kernels); do pkgs+=("lustre-client-modules-$k"); done
	[ ${#pkgs[@]} -gt 0 ] || die "no kernel under /lib/modules: install the kernel before this step"
	pkg_install "${pkgs[@]}" lustre-client-utils
	;;
rocky9)
	repo_url=$REPO/el/9/fsx-rpm-public-key.asc
	if ! probe "$repo_url"; then
		unreachable "$NAME" "$repo_url"
		exit 0
	fi
	rpm --import "$repo_url"
	[ -f /etc/yum.repos.d/aws-fsx.repo ] || curl -fsSL -o /etc/yum.repos.d/aws-fsx.repo "$REPO/el/9/fsx-lustre-client.repo"
	pkg_install kmod-lustre-client lustre-client
	;;
*)
	if ! probe "$REPO/"; then
		unreachable "$NAME" "$REPO/"
		exit 0
	fi
	die "the FSx Lustre client has no packages for ${IMAGE_OS:-this OS}: set lustre_client = false"
	;;
esac

for k in $(installed_kernels); do
	find "/lib/modules/$k" -name 'lustre.ko*' -print -quit | grep -q . ||
		die "no lustre module for kernel $k: the Lustre client packages do not match this kernel; hold the kernel at a version the FSx repository supports"
done
clear_skip "$NAME"
log "Lustre client installed for kernels: $(installed_kernels | tr '\n' ' ')"
