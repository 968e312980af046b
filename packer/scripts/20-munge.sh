#!/usr/bin/env bash
# 20-munge: MUNGE for Slurm's auth/munge. Distribution packages where they exist, else the
# pinned, sha256-verified source (Amazon Linux 2023 ships no munge). No key is baked in:
# nodes receive the cluster key at boot (slurm-node-agent bootstrap).
set -Eeuo pipefail
STEP=20-munge
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

if [ "${SLURM_AUTH:-munge}" = slurm ]; then
	log "auth is ${SLURM_AUTH}: MUNGE not needed, nothing to do"
	exit 0
fi

if command -v munged >/dev/null 2>&1 && command -v munge >/dev/null 2>&1; then
	log "munge already installed ($(munged --version 2>&1 | head -n1))"
else
	case $(os_family)/${IMAGE_OS:-} in
	deb/*) pkg_install munge libmunge2 ;;
	rpm/rocky*)
		pkg_install epel-release
		pkg_install munge munge-libs
		;;
	rpm/*)
		: "${MUNGE_VERSION:?MUNGE_VERSION is not set: ${IMAGE_OS} has no munge package, so it is built from the source pinned in packer/sources.toml}"
		pkg_install gcc make autoconf automake libtool openssl-devel bzip2-devel zlib-devel
		tarball=/var/cache/slurm-image/munge-$MUNGE_VERSION.tar.gz
		rc=0
		fetch_verified "MUNGE $MUNGE_VERSION source" "${MUNGE_URL:-}" "${MUNGE_SHA256:-}" "$tarball" || rc=$?
		[ "$rc" -eq 0 ] || die "MUNGE $MUNGE_VERSION source unreachable: ${MUNGE_URL:-}; auth/munge cannot work without it. Pre-fetch it into sources_dir."
		build=$(mktemp -d /var/tmp/munge-build.XXXXXX)
		tar -xzf "$tarball" -C "$build" --strip-components=1
		(
			cd "$build"
			[ -x configure ] || ./bootstrap
			./configure --prefix=/usr --sysconfdir=/etc --localstatedir=/var --runstatedir=/run -q
			make -s -j"$(nproc)"
			make -s install
		)
		rm -rf "$build"
		ldconfig
		;;
	esac
fi

getent group munge >/dev/null || groupadd -r munge
getent passwd munge >/dev/null || useradd -r -g munge -d /var/lib/munge -s /sbin/nologin munge
for d in /etc/munge /var/lib/munge /var/log/munge; do
	install -d -m 0700 -o munge -g munge "$d"
done
# Packages generate a key at install: every node from this image would share it. Remove it.
if [ -e /etc/munge/munge.key ]; then
	rm -f /etc/munge/munge.key
	log "removed the munge key the package generated (nodes get the cluster key at boot)"
fi
log "done"
