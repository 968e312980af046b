# shellcheck shell=bash
# Building Slurm from a source tree, shared by the image's step 30-slurm.sh and the test
# suite's host build (scripts/slurm-build.sh), so that the host, the fleet's controller and
# the node image run byte-identical builds of one pinned tarball. Sourced after lib.sh,
# never run.
#
# Environment:
#   PREFIX             installation prefix (default /opt/slurm)
#   SLURM_AUTH         munge (default) or slurm (auth/slurm only: --without-munge)
#   SLURM_BUILD_CACHE  folder of finished builds (optional). A build is kept there as
#                      slurm-<version>-<key>.tar, key = sha256 of the source's sha256, the
#                      configure flags, the OS and the architecture, and reused instead of
#                      compiling again when the same key comes back.
#   SLURM_INSTALL_UNITS  true (default): the build's units go to /usr/lib/systemd/system
#   SLURM_RECORD_FLAGS   true (default): the flags go to /etc/slurm-image/slurm-configure

: "${PREFIX:=/opt/slurm}"
: "${SLURM_AUTH:=munge}"

# Bumped when build_slurm's result changes for the same source and flags (cache keys).
SLURM_BUILD_RECIPE=3

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

# slurm_configure_flags: the configure flags of build_slurm, one per line.
slurm_configure_flags() {
	local pmix nvml
	pmix=$(pmix_prefix) || die "PMIx development files not found (pmix.h): install libpmix-dev / pmix-devel"
	printf '%s\n' --prefix="$PREFIX" --sysconfdir=/etc/slurm --with-systemdsystemunitdir=/usr/lib/systemd/system \
		--enable-pam --without-rpath --with-pmix="$pmix" --with-hwloc --with-jwt --with-json \
		--with-yaml --enable-slurmrestd
	# The managed service's join mode: auth/slurm (Slurm >= 23.11) and no MUNGE at all.
	if [ "$SLURM_AUTH" = slurm ]; then
		echo --without-munge
	fi
	if nvml=$(nvml_prefix); then
		echo --with-nvml="$nvml"
	else
		echo --without-nvml
	fi
}

# slurm_build_key SOURCE_SHA256 FLAGS...: the cache key of a build (16 hex digits).
slurm_build_key() {
	local sha=$1 os arch
	shift
	os=$(. /etc/os-release && echo "${ID:-unknown}-${VERSION_ID:-unknown}")
	arch=$(uname -m)
	printf 'recipe=%s\nsource=%s\nos=%s\narch=%s\n' "$SLURM_BUILD_RECIPE" "$sha" "$os" "$arch" |
		cat - <(printf '%s\n' "$@") | sha256sum | cut -c1-16
}

# install_slurm_tree STAGE: put a finished installation (a DESTDIR tree) in place. The
# prefix is swapped whole by two renames, so an interrupted install leaves either the old
# prefix or the new one, never a mix; the marker $PREFIX/.slurm-build is written last.
install_slurm_tree() {
	local stage=$1 key=$2 new old
	[ -x "$stage$PREFIX/sbin/slurmd" ] || die "the Slurm build in $stage has no $PREFIX/sbin/slurmd"
	new="$PREFIX.new.$$"
	old="$PREFIX.old.$$"
	rm -rf "$new" "$old"
	mkdir -p "$(dirname "$PREFIX")"
	cp -a "$stage$PREFIX" "$new"
	rm -f "$new/.slurm-build"
	if [ -e "$PREFIX" ]; then mv "$PREFIX" "$old"; fi
	mv "$new" "$PREFIX"
	rm -rf "$old"
	# The reference units of this version (Type=notify from 23.11), wherever the build
	# put them, also kept under the prefix for a host whose /usr/lib/systemd belongs to
	# its distribution's packages.
	if [ -d "$stage/usr/lib/systemd/system" ]; then
		install -d -m 0755 /usr/lib/systemd/system "$PREFIX/lib/systemd/system"
		local u
		for u in "$stage"/usr/lib/systemd/system/*.service; do
			[ -e "$u" ] || continue
			install -m 0644 "$u" "$PREFIX/lib/systemd/system/"
			if [ "${SLURM_INSTALL_UNITS:-true}" = true ]; then
				install -m 0644 "$u" /usr/lib/systemd/system/
			fi
		done
	fi
	echo "$PREFIX/lib" >/etc/ld.so.conf.d/slurm.conf
	ldconfig
	# Last: the marker that the prefix is whole (installed_version and slurm-build.sh
	# trust a prefix only with it).
	printf 'key=%s\nversion=%s\n' "$key" "$("$PREFIX/sbin/slurmd" -V 2>/dev/null | awk '{print $2}')" >"$PREFIX/.slurm-build.tmp"
	mv -f "$PREFIX/.slurm-build.tmp" "$PREFIX/.slurm-build"
}

# strip_slurm_tree STAGE: drops the static archives (libslurmfull.a and the plugins'
# .a files: 370 MB of the 450 MB that `make install` leaves; nothing on a node links
# statically against Slurm) and the debugging sections of the programs and libraries
# (Slurm builds with -g -ggdb3), as a distribution's package does; symbols stay, so
# backtraces still name functions.
strip_slurm_tree() {
	local f
	find "$1" -type f -name '*.a' -delete
	while IFS= read -r -d '' f; do
		case $(head -c 4 "$f" 2>/dev/null | od -An -c | tr -d ' ') in
		177ELF) strip --strip-debug "$f" ;;
		esac
	done < <(find "$1" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
}

# build_slurm DIR SOURCE_SHA256: configure, build and install the Slurm source tree DIR
# into $PREFIX, with the same flags whatever the tree came from; reuses a finished build
# of the same key from SLURM_BUILD_CACHE. With SLURM_BUILD_ONLY=true (and a cache) it only
# leaves the build in the cache and installs nothing. The flags are recorded in
# /etc/slurm-image/slurm-configure for the acceptance checks.
build_slurm() {
	local dir=$1 sha=$2 key stage cached flags=()
	mapfile -t flags < <(slurm_configure_flags)
	case " ${flags[*]} " in
	*" --without-nvml "*) log "skipping --with-nvml: NVIDIA's development files (nvml.h) are not installed (they come with the CUDA toolkit, outside Debian's main archive); AutoDetect=nvml will not be available" ;;
	esac
	key=$(slurm_build_key "$sha" "${flags[@]}")
	stage=$(mktemp -d /var/tmp/slurm-stage.XXXXXX)
	cached=
	if [ -n "${SLURM_BUILD_CACHE:-}" ]; then
		cached="$SLURM_BUILD_CACHE/slurm-${SLURM_VERSION:-unknown}-$key.tar"
	fi
	if [ -n "$cached" ] && [ -f "$cached" ] && tar -xf "$cached" -C "$stage" 2>/dev/null && [ -x "$stage$PREFIX/sbin/slurmd" ]; then
		log "Slurm ${SLURM_VERSION:-} build $key: reusing $cached (same source sha256 $sha and configure flags)"
	else
		rm -rf "$stage" && mkdir -p "$stage"
		log "configure ${flags[*]}"
		# The compiler's output goes to a log; its tail is shown when a stage fails.
		local blog=/var/log/slurm-build-$key.log
		(
			cd "$dir" || exit 1
			./configure -q "${flags[@]}" >"$blog" 2>&1 || { tail -n 40 "$blog"; die "Slurm's configure failed (full log: $blog)"; }
			log "building Slurm (make -j$(nproc); log: $blog)"
			make -s -j"$(nproc)" >>"$blog" 2>&1 || { tail -n 40 "$blog"; die "building Slurm failed (full log: $blog)"; }
			make -s install DESTDIR="$stage" >>"$blog" 2>&1 || { tail -n 40 "$blog"; die "installing Slurm failed (full log: $blog)"; }
		)
		rm -f "$blog"
		strip_slurm_tree "$stage"
		# Older trees without the units in their install rules: the generated files.
		if [ ! -e "$stage/usr/lib/systemd/system/slurmd.service" ] && [ -e "$dir/etc/slurmd.service" ]; then
			install -D -m 0644 "$dir/etc/slurmd.service" "$stage/usr/lib/systemd/system/slurmd.service"
		fi
		if [ -n "$cached" ]; then
			mkdir -p "$SLURM_BUILD_CACHE"
			tar -cf "$cached.tmp.$$" -C "$stage" . && mv -f "$cached.tmp.$$" "$cached"
			log "Slurm ${SLURM_VERSION:-} build $key kept as $cached"
		fi
	fi
	if [ "${SLURM_BUILD_ONLY:-false}" = true ]; then
		# Only fill the cache (scripts/slurm-build.sh --cache-only): nothing is installed.
		rm -rf "$stage"
		return 0
	fi
	install_slurm_tree "$stage" "$key"
	rm -rf "$stage"
	[ "${SLURM_RECORD_FLAGS:-true}" = true ] || return 0
	install -d -m 0755 /etc/slurm-image
	printf '%s\n' "${flags[@]}" >/etc/slurm-image/slurm-configure.tmp
	mv -f /etc/slurm-image/slurm-configure.tmp /etc/slurm-image/slurm-configure
}
