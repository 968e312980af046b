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
# With two or more versions in SLURM_VERSIONS (tarball only; SLURM_DEFAULT, default
# SLURM_VERSION, names the default; each version's pin in SLURM_URL_<v> and
# SLURM_SHA256_<v>, v with underscores for dots: SLURM_URL_25_11_6), each is built the same
# way into /opt/slurm-<version> and /opt/slurm is a symlink to the default's
# (install_slurm_versions in lib-slurm.sh); the units and PATH name /opt/slurm.
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

# slurm_build_version VERSION DEST: one of several versions: its pinned tarball fetched
# and verified, built (or reused from the build cache) and placed in DEST
# (install_slurm_versions calls it for each version not installed yet).
slurm_build_version() {
	local v=$1 dest=$2 var url sha tarball build rc=0
	var=${v//[!0-9A-Za-z]/_}
	url=SLURM_URL_$var
	sha=SLURM_SHA256_$var
	url=${!url:-}
	sha=${!sha:-}
	if [ -z "$url" ] || [ -z "$sha" ]; then die "Slurm $v has no pinned source: SLURM_URL_$var and SLURM_SHA256_$var must be set (slurm-image-builder passes each version's pin from sources.toml)"; fi
	if [ "$build_deps_installed" != true ]; then
		install_build_deps
		build_deps_installed=true
	fi
	build=$(mktemp -d /var/tmp/slurm-build.XXXXXX)
	tarball=/var/cache/slurm-image/slurm-$v.tar.gz
	fetch_verified "Slurm $v source" "$url" "$sha" "$tarball" || rc=$?
	[ "$rc" -eq 0 ] || die "Slurm $v source unreachable: $url. Pre-fetch it into sources_dir or fix the network path."
	tar -xaf "$tarball" -C "$build" --strip-components=1
	SLURM_VERSION=$v build_slurm "$build" "$sha" "$dest"
	rm -rf "$build"
}
build_deps_installed=false

# profile_and_links: PATH for login shells and the programs in /usr/local/bin, through
# $PREFIX (a symlink with several versions, so they follow it).
profile_and_links() {
	write_if_changed /etc/profile.d/slurm.sh 0644 <<'PROFILE'
# Slurm built by packer/scripts/30-slurm.sh
case ":$PATH:" in *:/opt/slurm/bin:*) ;; *) PATH=/opt/slurm/bin:/opt/slurm/sbin:$PATH ;; esac
PROFILE
	local b
	for b in "$PREFIX"/bin/* "$PREFIX"/sbin/*; do
		ln -sfn "$b" "/usr/local/bin/$(basename "$b")"
	done
}

read -r -a slurm_versions <<<"${SLURM_VERSIONS:-}"
have=$(installed_version)
if [ "${#slurm_versions[@]}" -gt 1 ]; then
	SLURM_DEFAULT=${SLURM_DEFAULT:-$SLURM_VERSION}
	[ "$SLURM_DEFAULT" = "$SLURM_VERSION" ] || die "SLURM_DEFAULT ($SLURM_DEFAULT) and SLURM_VERSION ($SLURM_VERSION) differ: SLURM_VERSION is the default version"
	[ "$SLURM_SOURCE" = tarball ] || die "slurm_source = $SLURM_SOURCE installs one Slurm version, not ${#slurm_versions[@]} (${slurm_versions[*]}): use slurm_source = tarball"
	install_slurm_versions "$SLURM_DEFAULT" "${slurm_versions[@]}"
	# The reference units of the default version: one set, naming /opt/slurm.
	if [ "${SLURM_INSTALL_UNITS:-true}" = true ] && compgen -G "$PREFIX/lib/systemd/system/*.service" >/dev/null; then
		install -d -m 0755 /usr/lib/systemd/system
		install -m 0644 "$PREFIX"/lib/systemd/system/*.service /usr/lib/systemd/system/
	fi
	echo "$PREFIX/lib" >/etc/ld.so.conf.d/slurm.conf
	ldconfig
	profile_and_links
	have=$(installed_version)
	[ "$have" = "$SLURM_VERSION" ] || die "$PREFIX reports Slurm ${have:-nothing}, expected the default $SLURM_VERSION"
elif [ "$have" = "$SLURM_VERSION" ]; then
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
	profile_and_links
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
if [ "${#slurm_versions[@]}" -gt 1 ]; then
	log "slurm ${slurm_versions[*]} installed in $(slurm_version_prefix '<version>'); $PREFIX -> $(readlink "$PREFIX")"
else
	log "slurm $(installed_version) installed"
fi
