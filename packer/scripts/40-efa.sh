#!/usr/bin/env bash
# 40-efa: the AWS EFA installer (pinned version, sha256-verified): kernel module, rdma-core,
# libfabric with the efa provider, under /opt/amazon/efa.
set -Eeuo pipefail
STEP=40-efa
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

NAME="EFA installer ${EFA_INSTALLER_VERSION:-}"
if [ -z "${EFA_INSTALLER_VERSION:-}" ]; then
	log "efa_installer_version is empty: EFA left out of this image"
	exit 0
fi
if [ -x /opt/amazon/efa/bin/fi_info ] && grep -qs "^$EFA_INSTALLER_VERSION\$" /opt/amazon/efa_installed_version 2>/dev/null; then
	log "EFA $EFA_INSTALLER_VERSION already installed"
	exit 0
fi

tarball=/var/cache/slurm-image/aws-efa-installer-$EFA_INSTALLER_VERSION.tar.gz
rc=0
fetch_verified "$NAME" "${EFA_INSTALLER_URL:-}" "${EFA_INSTALLER_SHA256:-}" "$tarball" || rc=$?
if [ "$rc" -ne 0 ]; then
	unreachable "$NAME" "$EFA_INSTALLER_URL"
	exit 0
fi

case ${IMAGE_OS:-} in
al2023 | ubuntu-22.04 | ubuntu-24.04 | rocky9) ;;
*) die "the EFA installer does not support ${IMAGE_OS:-this OS}: set efa_installer_version = \"\" to leave EFA out" ;;
esac

build=$(mktemp -d /var/tmp/efa.XXXXXX)
tar -xzf "$tarball" -C "$build"
(
	cd "$build/aws-efa-installer"
	# --skip-limit-conf: the agent and slurmd units own memlock limits.
	./efa_installer.sh -y --skip-limit-conf
) || die "efa_installer.sh failed: see its log above (/var/log/efa_installer.log); a kernel without headers is the usual cause"
rm -rf "$build"
printf '%s\n' "$EFA_INSTALLER_VERSION" >/opt/amazon/efa_installed_version
clear_skip "$NAME"
log "EFA $EFA_INSTALLER_VERSION installed"
