#!/usr/bin/env bash
# 30-slurm: Slurm's node side (slurmd, slurmrestd and the client commands), from one of:
# - SLURM_SOURCE=tarball: the pinned, sha256-verified upstream source tarball, built into
#   /opt/slurm;
# - SLURM_SOURCE=debian-source: Debian's own Slurm source package (`apt-get source
#   slurm-wlm` through a deb-src entry for the mirror the root already uses; apt checks it
#   against the signed Sources index), built into /opt/slurm by the same build_slurm and
#   the same configure flags. This is how the source build is proven where upstream
#   tarballs cannot be fetched;
# - SLURM_SOURCE=distro: the distribution's packages, which must ship SLURM_VERSION.
# Source builds enable PMIx (`srun --mpi=pmix`), hwloc, JWT and slurmrestd, and NVML
# (`AutoDetect=nvml`) when NVIDIA's development files are installed.
set -Eeuo pipefail
STEP=30-slurm
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
# shellcheck source=lib-slurm.sh
. "$(dirname "$lib")/lib-slurm.sh"
require_root

: "${SLURM_VERSION:?SLURM_VERSION is not set: pass the slurm_version variable}"
SLURM_SOURCE=${SLURM_SOURCE:-tarball}
SLURM_AUTH=${SLURM_AUTH:-munge}
PREFIX=/opt/slurm
# Finished builds, kept between image builds (a folder the builder mounts here).
SLURM_BUILD_CACHE=${SLURM_BUILD_CACHE:-/var/cache/slurm-image/builds}

# installed_version: the version of the slurmd in place; a source build counts only once
# its prefix carries the marker install_slurm_tree writes last.
installed_version() {
	local bin
	bin=$(command -v slurmd 2>/dev/null || true)
	case $bin in "$PREFIX"/* | /usr/local/bin/*) [ -f "$PREFIX/.slurm-build" ] || bin= ;; esac
	[ -n "$bin" ] || { [ -x $PREFIX/sbin/slurmd ] && [ -f "$PREFIX/.slurm-build" ] && bin=$PREFIX/sbin/slurmd; }
	[ -n "$bin" ] || return 0
	"$bin" -V 2>/dev/null | awk '{print $2}'
}

# fetch_debian_source DIR: Debian's Slurm source package for SLURM_VERSION, unpacked
# into DIR. The deb-src entry names the mirror the root's own deb entry uses and is
# removed afterwards, with its index files.
fetch_debian_source() {
	local dir=$1 uri list=/etc/apt/sources.list.d/slurm-image-src.sources work
	[ "$(os_family)" = deb ] || die "slurm_source = debian-source needs a Debian root"
	local f
	uri=
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		if [ ! -r "$f" ] || [ "$f" = "$list" ]; then continue; fi
		uri=$(awk '/^URIs:/ {print $2; exit} /^deb / {u = $2; if (u ~ /^\[/) u = $3; print u; exit}' "$f")
		[ -z "$uri" ] || break
	done
	[ -n "$uri" ] || die "no Debian mirror configured in /etc/apt: cannot add a deb-src entry"
	. /etc/os-release
	cat >"$list" <<SRC
Types: deb-src
URIs: $uri
Suites: $VERSION_CODENAME $VERSION_CODENAME-updates
Components: main
SRC
	trap 'rm -f "$list"' RETURN
	apt_get update || die "apt-get update with the deb-src entry for $uri failed"
	work=$(mktemp -d /var/tmp/slurm-src.XXXXXX)
	# --download-only: apt checks each file against the signed Sources index. The upstream
	# tarball of the package (`.orig.tar.*`) is built as it is, like a pinned tarball: the
	# Debian patches change Makefile.am files and expect dh_autoreconf, which is Debian's
	# packaging, not Slurm's build.
	(cd "$work" && apt_get source --download-only "slurm-wlm") || die "apt-get source slurm-wlm failed (mirror $uri)"
	local orig dsc
	orig=$(find "$work" -maxdepth 1 -name 'slurm-wlm_*.orig.tar.*' | head -n1)
	[ -n "$orig" ] || die "apt-get source slurm-wlm fetched no upstream tarball into $work"
	local got=${orig##*/slurm-wlm_}
	got=${got%%.orig.tar.*}
	[ "$got" = "$SLURM_VERSION" ] || die "Debian's source package is Slurm $got, not the requested $SLURM_VERSION"
	dsc=$(find "$work" -maxdepth 1 -name '*.dsc' -printf '%f\n' | head -n1)
	log "Debian source package ${dsc%.dsc}: building its upstream tarball $(basename "$orig")"
	tar -xaf "$orig" -C "$dir" --strip-components=1
	src_sha=$(sha256_of "$orig")
	rm -rf "$work"
	rm -f "$list"
	apt_get update >/dev/null 2>&1 || true
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
elif [ "$SLURM_SOURCE" = tarball ] || [ "$SLURM_SOURCE" = debian-source ]; then
	[ -z "$have" ] || log "replacing slurm $have with $SLURM_VERSION"
	install_build_deps
	build=$(mktemp -d /var/tmp/slurm-build.XXXXXX)
	if [ "$SLURM_SOURCE" = tarball ]; then
		tarball=/var/cache/slurm-image/slurm-$SLURM_VERSION.tar.gz
		rc=0
		fetch_verified "Slurm $SLURM_VERSION source" "${SLURM_URL:-}" "${SLURM_SHA256:-}" "$tarball" || rc=$?
		[ "$rc" -eq 0 ] || die "Slurm $SLURM_VERSION source unreachable: ${SLURM_URL:-}. Pre-fetch it into sources_dir or fix the network path."
		tar -xaf "$tarball" -C "$build" --strip-components=1
		src_sha=$SLURM_SHA256
	else
		fetch_debian_source "$build"
	fi
	build_slurm "$build" "${src_sha:?}"
	rm -rf "$build"
	write_if_changed /etc/profile.d/slurm.sh 0644 <<'PROFILE'
# Slurm built by packer/scripts/30-slurm.sh
case ":$PATH:" in *:/opt/slurm/bin:*) ;; *) PATH=/opt/slurm/bin:/opt/slurm/sbin:$PATH ;; esac
PROFILE
	for b in "$PREFIX"/bin/* "$PREFIX"/sbin/*; do
		ln -sfn "$b" "/usr/local/bin/$(basename "$b")"
	done
	have=$(installed_version)
	[ "$have" = "$SLURM_VERSION" ] || die "built Slurm reports ${have:-nothing}, expected $SLURM_VERSION: check the source pinned for $SLURM_VERSION"
else
	die "slurm_source must be tarball, debian-source or distro, not '$SLURM_SOURCE'"
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
