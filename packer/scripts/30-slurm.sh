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

# install_build_deps: compilers and the libraries behind the configure flags of
# build_slurm, as packages of the OS family.
install_build_deps() {
	local munge_dev=
	if [ "$SLURM_AUTH" = munge ]; then
		if [ "$(os_family)" = deb ]; then munge_dev=libmunge-dev; else munge_dev=munge-devel; fi
	fi
	if [ "$(os_family)" = deb ]; then
		# shellcheck disable=SC2086 # empty when auth/slurm
		pkg_install build-essential dpkg-dev $munge_dev libssl-dev libpam0g-dev \
			libhwloc-dev libpmix-dev libjson-c-dev libjwt-dev libhttp-parser-dev liblz4-dev libyaml-dev \
			libdbus-1-dev libreadline-dev python3 bzip2
	else
		# shellcheck disable=SC2086
		pkg_install gcc gcc-c++ make $munge_dev openssl-devel pam-devel hwloc-devel pmix-devel \
			json-c-devel libjwt-devel http-parser-devel lz4-devel libyaml-devel dbus-devel \
			readline-devel python3 bzip2 perl
	fi
}

# pmix_prefix: the PMIx installation configure needs (Debian keeps it under the
# multiarch pmix2 folder, the RPM families under /usr).
pmix_prefix() {
	local d
	for d in /usr/lib/*-linux-gnu/pmix2 /usr/lib/*-linux-gnu/pmix /usr/local /usr; do
		[ -r "$d/include/pmix.h" ] && { echo "$d"; return 0; }
	done
	return 1
}

# nvml_prefix: where NVIDIA's development files (nvml.h) are, if anywhere: the CUDA
# toolkit or the driver's development package; neither is in Debian's main archive.
nvml_prefix() {
	local d
	for d in /usr/local/cuda /usr/local/cuda-* /usr; do
		[ -r "$d/include/nvml.h" ] && { echo "$d"; return 0; }
	done
	return 1
}

# build_slurm DIR: configure, build and install the Slurm source tree DIR into $PREFIX,
# with the same flags whatever the tree came from. The flags are recorded in
# /etc/slurm-image/slurm-configure for the acceptance checks.
build_slurm() {
	local dir=$1 pmix nvml flags
	pmix=$(pmix_prefix) || die "PMIx development files not found (pmix.h): install libpmix-dev / pmix-devel"
	flags=(--prefix="$PREFIX" --sysconfdir=/etc/slurm --with-systemdsystemunitdir=/usr/lib/systemd/system
		--enable-pam --without-rpath --with-pmix="$pmix" --with-hwloc --with-jwt --with-json
		--with-yaml --enable-slurmrestd)
	# The managed service's join mode: auth/slurm (Slurm >= 23.11) and no MUNGE at all.
	if [ "$SLURM_AUTH" = slurm ]; then
		flags+=(--without-munge)
	fi
	if nvml=$(nvml_prefix); then
		flags+=(--with-nvml="$nvml")
	else
		log "skipping --with-nvml: NVIDIA's development files (nvml.h) are not installed (they come with the CUDA toolkit, outside Debian's main archive); AutoDetect=nvml will not be available"
		flags+=(--without-nvml)
	fi
	log "configure ${flags[*]}"
	# The compiler's output goes to a log; its tail is shown when a stage fails.
	local blog=/var/log/slurm-image-build.log
	(
		cd "$dir"
		./configure -q "${flags[@]}" >"$blog" 2>&1 || { tail -n 40 "$blog"; die "Slurm's configure failed (full log: $blog)"; }
		log "building Slurm (make -j$(nproc); log: $blog)"
		make -s -j"$(nproc)" >>"$blog" 2>&1 || { tail -n 40 "$blog"; die "building Slurm failed (full log: $blog)"; }
		make -s install >>"$blog" 2>&1 || { tail -n 40 "$blog"; die "installing Slurm failed (full log: $blog)"; }
	)
	rm -f "$blog"
	install -m 0644 "$dir/etc/slurmd.service" /usr/lib/systemd/system/slurmd.service 2>/dev/null || true
	install -d -m 0755 /etc/slurm-image
	printf '%s\n' "${flags[@]}" >/etc/slurm-image/slurm-configure.tmp
	mv -f /etc/slurm-image/slurm-configure.tmp /etc/slurm-image/slurm-configure
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
	else
		fetch_debian_source "$build"
	fi
	build_slurm "$build"
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
