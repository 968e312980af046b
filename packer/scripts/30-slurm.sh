#!/usr/bin/env bash
# 30-slurm: Slurm's node side (slurmd and the client commands), either built from the
# pinned, sha256-verified source tarball (SLURM_SOURCE=tarball, into /opt/slurm) or from
# the distribution's packages (SLURM_SOURCE=distro), which must ship SLURM_VERSION.
set -Eeuo pipefail
STEP=30-slurm
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

: "${SLURM_VERSION:?SLURM_VERSION is not set: pass the slurm_version variable}"
SLURM_SOURCE=${SLURM_SOURCE:-tarball}
SLURM_AUTH=${SLURM_AUTH:-munge}
PREFIX=/opt/slurm

installed_version() {
	local bin
	bin=$(command -v slurmd 2>/dev/null || true)
	[ -n "$bin" ] || { [ -x $PREFIX/sbin/slurmd ] && bin=$PREFIX/sbin/slurmd; }
	[ -n "$bin" ] || return 0
	"$bin" -V 2>/dev/null | awk '{print $2}'
}

have=$(installed_version)
if [ "$have" = "$SLURM_VERSION" ]; then
	log "slurm $SLURM_VERSION already installed"
elif [ "$SLURM_SOURCE" = distro ]; then
	case $(os_family)/${IMAGE_OS:-} in
	deb/*) pkg_install slurmd slurm-client ;;
	rpm/rocky*)
		pkg_install epel-release
		pkg_install slurm-slurmd slurm
		;;
	*) die "${IMAGE_OS:-this OS} has no Slurm packages: use slurm_source = \"tarball\"" ;;
	esac
	have=$(installed_version)
	[ "$have" = "$SLURM_VERSION" ] ||
		die "the distribution's Slurm is ${have:-missing}, not the requested $SLURM_VERSION: request $have or use slurm_source = \"tarball\""
elif [ "$SLURM_SOURCE" = tarball ]; then
	[ -z "$have" ] || log "replacing slurm $have with $SLURM_VERSION"
	if [ "$(os_family)" = deb ]; then
		pkg_install build-essential libmunge-dev libssl-dev libpam0g-dev libhwloc-dev libjson-c-dev \
			libjwt-dev liblz4-dev libyaml-dev libdbus-1-dev python3 bzip2
	else
		pkg_install gcc gcc-c++ make munge-devel openssl-devel pam-devel hwloc-devel json-c-devel \
			lz4-devel libyaml-devel dbus-devel python3 bzip2 perl
	fi
	tarball=/var/cache/slurm-image/slurm-$SLURM_VERSION.tar.gz
	rc=0
	fetch_verified "Slurm $SLURM_VERSION source" "${SLURM_URL:-}" "${SLURM_SHA256:-}" "$tarball" || rc=$?
	[ "$rc" -eq 0 ] || die "Slurm $SLURM_VERSION source unreachable: ${SLURM_URL:-}. Pre-fetch it into sources_dir or fix the network path."
	build=$(mktemp -d /var/tmp/slurm-build.XXXXXX)
	tar -xaf "$tarball" -C "$build" --strip-components=1
	(
		cd "$build"
		./configure -q --prefix=$PREFIX --sysconfdir=/etc/slurm --with-systemdsystemunitdir=/usr/lib/systemd/system \
			--enable-pam --without-rpath
		make -s -j"$(nproc)"
		make -s install
	)
	install -m 0644 "$build/etc/slurmd.service" /usr/lib/systemd/system/slurmd.service 2>/dev/null || true
	rm -rf "$build"
	echo "$PREFIX/lib" >/etc/ld.so.conf.d/slurm.conf
	ldconfig
	write_if_changed /etc/profile.d/slurm.sh 0644 <<'PROFILE'
# Slurm built by packer/scripts/30-slurm.sh
case ":$PATH:" in *:/opt/slurm/bin:*) ;; *) PATH=/opt/slurm/bin:/opt/slurm/sbin:$PATH ;; esac
PROFILE
	for b in "$PREFIX"/bin/* "$PREFIX"/sbin/*; do
		ln -sfn "$b" "/usr/local/bin/$(basename "$b")"
	done
	have=$(installed_version)
	[ "$have" = "$SLURM_VERSION" ] || die "built Slurm reports ${have:-nothing}, expected $SLURM_VERSION: check the tarball pinned for $SLURM_VERSION"
else
	die "slurm_source must be tarball or distro, not '$SLURM_SOURCE'"
fi

if [ "$SLURM_AUTH" = slurm ]; then
	plugin=$(find /usr/lib* $PREFIX/lib -name auth_slurm.so 2>/dev/null | head -n1)
	[ -n "$plugin" ] || die "auth/slurm requested but Slurm $SLURM_VERSION has no auth_slurm plugin (it arrived in 23.11): use auth = \"munge\""
fi

getent group slurm >/dev/null || groupadd -r slurm
getent passwd slurm >/dev/null || useradd -r -g slurm -d /var/lib/slurm -s /sbin/nologin slurm
install -d -m 0755 /etc/slurm
install -d -m 0755 -o slurm -g slurm /var/spool/slurmd /var/log/slurm
log "slurm $(installed_version) installed"
