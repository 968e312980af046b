# shellcheck shell=bash
# Building Slurm from a source tree, shared by the image's step 30-slurm.sh and the test
# suite's host build (scripts/slurm-build.sh), so that the host, the fleet's controller and
# the node image run byte-identical builds of one pinned tarball. Sourced after lib.sh,
# never run.
#
# Environment:
#   PREFIX             installation prefix (default /opt/slurm)
#   SLURM_AUTH         munge (default), munge+slurm (both: the same build) or slurm
#                      (auth/slurm only: --without-munge)
#   SLURM_BUILD_CACHE  folder of finished builds (optional). A build is kept there as
#                      slurm-<version>-<key>.tar, key = sha256 of the source's sha256, the
#                      configure flags, the OS and the architecture, and reused instead of
#                      compiling again when the same key comes back.
#   SLURM_INSTALL_UNITS  true (default): the build's units go to /usr/lib/systemd/system
#   SLURM_RECORD_FLAGS   true (default): the flags go to /etc/slurm-image/slurm-configure
#   SLURM_OPT_ROOT     where several versions side by side go (default: the folder of
#                      PREFIX, /opt): SLURM_OPT_ROOT/slurm-<version> and the symlink
#                      SLURM_OPT_ROOT/slurm (tests point it at a temporary folder)

: "${PREFIX:=/opt/slurm}"
: "${SLURM_AUTH:=munge}"
: "${SLURM_OPT_ROOT:=$(dirname "$PREFIX")}"
SLURM_LINK_NAME=$(basename "$PREFIX")

# Bumped when build_slurm's result changes for the same source and flags (cache keys).
SLURM_BUILD_RECIPE=3

# install_build_deps: compilers and the libraries behind the configure flags of
# build_slurm, as packages of the OS family.
install_build_deps() {
	local munge_dev=
	if [ "$SLURM_AUTH" != slurm ]; then
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

# build_slurm DIR SOURCE_SHA256 [DEST]: configure, build and install the Slurm source tree
# DIR into $PREFIX, with the same flags whatever the tree came from; reuses a finished build
# of the same key from SLURM_BUILD_CACHE. With DEST (one of several versions side by side)
# the tree, built for $PREFIX all the same, goes to DEST by place_slurm_tree instead. With SLURM_BUILD_ONLY=true (and a cache) it only
# leaves the build in the cache and installs nothing. The flags are recorded in
# /etc/slurm-image/slurm-configure for the acceptance checks.
build_slurm() {
	local dir=$1 sha=$2 dest=${3:-} key stage cached flags=()
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
	if [ -n "$dest" ]; then
		place_slurm_tree "$stage" "$key" "$dest" "${SLURM_VERSION:?}"
	else
		install_slurm_tree "$stage" "$key"
	fi
	rm -rf "$stage"
	[ "${SLURM_RECORD_FLAGS:-true}" = true ] || return 0
	install -d -m 0755 /etc/slurm-image
	printf '%s\n' "${flags[@]}" >/etc/slurm-image/slurm-configure.tmp
	mv -f /etc/slurm-image/slurm-configure.tmp /etc/slurm-image/slurm-configure
}

# Several versions side by side (the recipe's slurm_versions, two or more). Each version is
# built exactly as a single one (for --prefix=$PREFIX, so the build cache and its keys are
# the same) and its finished tree goes to $SLURM_OPT_ROOT/slurm-<MAJOR.MINOR.MICRO>, swapped
# in whole by renames, with its marker .slurm-build (key=, version=) written last inside
# it. A prefix without the marker is half-installed: the next run removes it and installs
# it again, and nothing else treats it as installed (the agent finds the versions as
# $SLURM_OPT_ROOT/slurm-*/.slurm-build). $PREFIX is a relative symlink to the default's
# prefix (slurm -> slurm-25.11.6), replaced atomically. Every tree names $PREFIX (RUNPATH,
# PluginDir), so a version's programs run only while the symlink points at it: the agent
# switches it at boot to the version the controller accepts, and units and PATH keep
# naming $PREFIX.

# slurm_version_prefix VERSION: the prefix of one of several versions.
slurm_version_prefix() {
	printf '%s/%s-%s\n' "$SLURM_OPT_ROOT" "$SLURM_LINK_NAME" "$1"
}

# check_slurm_version_list DEFAULT VERSION...: refuse, naming it, a version that is not
# MAJOR.MINOR.MICRO, a version listed twice, and a default that is not listed.
check_slurm_version_list() {
	local default=$1 v seen=' '
	shift
	[ "$#" -gt 0 ] || die "SLURM_VERSIONS is empty"
	for v in "$@"; do
		[[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "SLURM_VERSIONS ($*): '$v' is not MAJOR.MINOR.MICRO (it names the prefix $(slurm_version_prefix "$v"))"
		case $seen in *" $v "*) die "SLURM_VERSIONS ($*) lists Slurm $v twice: list each version once" ;; esac
		seen="$seen$v "
	done
	case $seen in *" $default "*) ;; *) die "the default Slurm $default is not in SLURM_VERSIONS ($*)" ;; esac
}

# slurm_version_installed VERSION: whether the version's prefix is whole: its marker,
# written last, names that version.
slurm_version_installed() {
	local marker
	marker="$(slurm_version_prefix "$1")/.slurm-build"
	[ -f "$marker" ] && grep -qx "version=$1" "$marker"
}

# clear_slurm_leftovers: remove what an interrupted install left: the temporary trees of
# a swap (slurm-<version>.new.<pid>, .old.<pid>, and slurm.new/.old of a single-version
# install), a temporary symlink, and every versioned prefix without its marker.
clear_slurm_leftovers() {
	local p v
	for p in "$SLURM_OPT_ROOT/$SLURM_LINK_NAME"*.new.* "$SLURM_OPT_ROOT/$SLURM_LINK_NAME"*.old.* "$SLURM_OPT_ROOT/.$SLURM_LINK_NAME.link."*; do
		[ -e "$p" ] || [ -L "$p" ] || continue
		log "removing $p, left by an interrupted install"
		rm -rf "$p"
	done
	for p in "$SLURM_OPT_ROOT/$SLURM_LINK_NAME"-*; do
		v=${p##*/"$SLURM_LINK_NAME"-}
		[[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || continue
		if [ -L "$p" ] || ! slurm_version_installed "$v"; then
			log "removing $p: half-installed (no marker $p/.slurm-build naming $v); it is installed again if listed"
			rm -rf "$p"
		fi
	done
}

# place_slurm_tree STAGE KEY DEST VERSION: put a finished tree (a DESTDIR tree, built for
# $PREFIX: STAGE$PREFIX) in DEST, swapped whole by renames, with the version's reference
# units kept under DEST/lib/systemd/system; the marker DEST/.slurm-build (key=,
# version=VERSION) last. Its programs cannot run here (they load from $PREFIX):
# verify_slurm_versions runs them through the symlink.
place_slurm_tree() {
	local stage=$1 key=$2 dest=$3 version=$4 new old u
	[ -x "$stage$PREFIX/sbin/slurmd" ] || die "the Slurm $version build in $stage has no $PREFIX/sbin/slurmd"
	new="$dest.new.$$"
	old="$dest.old.$$"
	rm -rf "$new" "$old"
	mkdir -p "$(dirname "$dest")"
	cp -a "$stage$PREFIX" "$new"
	rm -f "$new/.slurm-build"
	if [ -d "$stage/usr/lib/systemd/system" ]; then
		install -d -m 0755 "$new/lib/systemd/system"
		for u in "$stage"/usr/lib/systemd/system/*.service; do
			[ -e "$u" ] || continue
			install -m 0644 "$u" "$new/lib/systemd/system/"
		done
	fi
	if [ -e "$dest" ] || [ -L "$dest" ]; then mv -T "$dest" "$old"; fi
	mv -T "$new" "$dest"
	rm -rf "$old"
	printf 'key=%s\nversion=%s\n' "$key" "$version" >"$dest/.slurm-build.tmp"
	mv -f "$dest/.slurm-build.tmp" "$dest/.slurm-build"
}

# slurm_linked_version: the version the symlink $SLURM_OPT_ROOT/slurm points at; empty
# when it is not such a symlink.
slurm_linked_version() {
	local t
	t=$(readlink "$SLURM_OPT_ROOT/$SLURM_LINK_NAME" 2>/dev/null) || return 0
	case $t in "$SLURM_LINK_NAME"-*) echo "${t#"$SLURM_LINK_NAME"-}" ;; esac
}

# link_slurm_prefix VERSION: point $SLURM_OPT_ROOT/slurm at slurm-VERSION (relative),
# atomically: a temporary symlink renamed over the old one. A real folder there (an
# earlier single-version install) is moved aside, and removed once the symlink is in place.
link_slurm_prefix() {
	local v=$1 link tmp aside=
	link="$SLURM_OPT_ROOT/$SLURM_LINK_NAME"
	slurm_version_installed "$v" || die "Slurm $v is not installed in $(slurm_version_prefix "$v") (no marker): $link is not pointed at it"
	tmp="$SLURM_OPT_ROOT/.$SLURM_LINK_NAME.link.$$"
	rm -f "$tmp"
	ln -s "$SLURM_LINK_NAME-$v" "$tmp"
	if [ -d "$link" ] && [ ! -L "$link" ]; then
		aside="$link.old.$$"
		rm -rf "$aside"
		mv -T "$link" "$aside"
	fi
	mv -T "$tmp" "$link"
	[ -z "$aside" ] || rm -rf "$aside"
}

# verify_slurm_versions VERSION...: each version's slurmd -V, run while the symlink points
# at it; the symlink then goes back to where it pointed. A version whose slurmd reports
# another is removed (never left counting as installed) and named.
verify_slurm_versions() {
	local back v got
	back=$(slurm_linked_version)
	for v in "$@"; do
		link_slurm_prefix "$v"
		got=$("$SLURM_OPT_ROOT/$SLURM_LINK_NAME/sbin/slurmd" -V 2>/dev/null | awk '{print $2}' || true)
		if [ "$got" != "$v" ]; then
			[ -z "$back" ] || [ "$back" = "$v" ] || link_slurm_prefix "$back"
			rm -rf "$(slurm_version_prefix "$v")"
			die "the Slurm built for $v reports ${got:-nothing} (slurmd -V): its prefix is removed; check the source pinned for $v"
		fi
		log "slurm $v in $(slurm_version_prefix "$v"): slurmd -V reports $got"
	done
	[ -z "$back" ] || link_slurm_prefix "$back"
}

# install_slurm_versions DEFAULT VERSION...: every version in its prefix, then the symlink
# to DEFAULT's. A prefix with its marker is kept; every other version is made by the
# caller's `slurm_build_version VERSION DEST` (fetch, verify, `build_slurm DIR SHA DEST`).
# Prefixes of versions not listed are removed, so the image holds exactly the list.
install_slurm_versions() {
	local default=$1 v p
	shift
	check_slurm_version_list "$default" "$@"
	clear_slurm_leftovers
	for v in "$@"; do
		p=$(slurm_version_prefix "$v")
		if slurm_version_installed "$v"; then
			log "slurm $v already installed in $p"
			continue
		fi
		slurm_build_version "$v" "$p"
		slurm_version_installed "$v" || die "Slurm $v: no marker $p/.slurm-build after its install"
	done
	link_slurm_prefix "$default"
	verify_slurm_versions "$@"
	for p in "$SLURM_OPT_ROOT/$SLURM_LINK_NAME"-*; do
		if [ ! -d "$p" ] || [ -L "$p" ]; then continue; fi
		v=${p##*/"$SLURM_LINK_NAME"-}
		case " $* " in *" $v "*) continue ;; esac
		log "removing $p: Slurm $v is not in SLURM_VERSIONS ($*)"
		rm -rf "$p"
	done
}
