#!/usr/bin/env bash
# Puts one Slurm version in place on this host for the test suite: SchedMD's release
# tarball from a sources folder, checked against the sha256 pinned in packer/sources.toml,
# built by the image's own build function (packer/scripts/lib-slurm.sh: the same configure
# flags, prefix /opt/slurm, sysconfdir /etc/slurm) and kept in a build cache keyed by that
# checksum and the flags, which the fleet's image build reuses. A second run with the same
# version only swaps the prefix back in (seconds).
#
#   sudo scripts/slurm-build.sh VERSION     # 25.11, 25.11.6, 24.11 ... or 22.05 (Debian's)
#   sudo scripts/slurm-build.sh --cache-only VERSION   # build into the cache only: what is
#                                           # in /opt/slurm stays (prints the cached tar)
#   scripts/slurm-build.sh --fetch-only VERSION   # only put the verified tarball in place
#                                           # (prints its path)
#
# A tarball missing from the sources folder is downloaded from its pinned URL in
# packer/sources.toml into SLURM_DOWNLOAD_DIR and used only once its sha256 equals the pin
# (a clone without ../shared/sources builds from the network, as the README says).
#
# Prints the prefix (its sbin/, bin/, lib/systemd/system/) as its last line of stdout:
#   export SLURM_E2E_PREFIX=$(scripts/slurm-build.sh 25.11 | tail -n1)
#
# Environment:
#   SLURM_SOURCES_DIR  where the tarballs are (default: ../shared/sources beside the repo);
#                      file names as SchedMD serves them: slurm-<25-11-6>-1.tar.gz
#   SLURM_DOWNLOAD_DIR where a missing tarball is downloaded to (default
#                      /var/cache/slurm-e2e/sources)
#   SLURM_SOURCE_URL   the URL to download it from instead of the pinned one (a mirror;
#                      the pinned sha256 still decides)
#   SLURM_SOURCES_TOML the pins (default packer/sources.toml; the tests' own pins)
#   SLURM_BUILD_CACHE  finished builds (default /var/cache/slurm-e2e/slurm-builds)
#   SLURM_AUTH         munge (default) or slurm
#
# Exit codes (sysexits): 64 the version is not pinned in packer/sources.toml, 65 the
# tarball's checksum differs from the pin (a downloaded one is deleted), 66 the sources
# folder has no tarball for it and its URL could not be downloaded, 1 the build failed.
# Nothing is installed in any of these cases.
set -Eeuo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
STEP=slurm-build
# shellcheck source=packer/scripts/lib.sh
. "$repo/packer/scripts/lib.sh"
# shellcheck source=packer/scripts/lib-slurm.sh
. "$repo/packer/scripts/lib-slurm.sh"

# Progress on stderr: stdout carries only the prefix.
log() { printf '[%s] %s\n' "$STEP" "$*" >&2; }

fail() {
	printf 'slurm-build: %s\n' "$2" >&2
	exit "$1"
}

cache_only=false
fetch_only=false
case ${1:-} in
--cache-only)
	cache_only=true
	shift
	;;
--fetch-only)
	fetch_only=true
	shift
	;;
esac
[ $# -eq 1 ] || fail 64 "usage: scripts/slurm-build.sh [--cache-only | --fetch-only] VERSION (e.g. 25.11 or 25.11.6; 22.05 for Debian 12's packages)"
want=$1
sources_toml=${SLURM_SOURCES_TOML:-$repo/packer/sources.toml}

# Debian 12's own packages (installed by scripts/test-deps.sh): nothing to build.
case $want in
22.05 | 22.05.8 | debian)
	[ "$cache_only" = false ] || fail 64 "Slurm $want is Debian's package: nothing to build"
	command -v /usr/sbin/slurmd >/dev/null || fail 66 "Debian's slurmd is not installed: run scripts/test-deps.sh"
	echo /usr
	exit 0
	;;
esac
case $want in
*[!0-9.]* | '') fail 64 "'$want' is not a Slurm version (MAJOR.MINOR or MAJOR.MINOR.MICRO)" ;;
esac

# pins: "version sha256 url" for every [slurm."X"] section of sources.toml.
pins() {
	awk '
		function flush() { if (v != "" && s != "") print v, s, u; v = ""; s = ""; u = "" }
		/^\[slurm\."[0-9.]+"\]/ { flush(); v = $0; sub(/^\[slurm\."/, "", v); sub(/"\].*/, "", v); next }
		/^\[/ { flush() }
		v != "" && /^sha256[ \t]*=/ { s = $0; sub(/^[^"]*"/, "", s); sub(/".*/, "", s) }
		v != "" && /^url[ \t]*=/ { u = $0; sub(/^[^"]*"/, "", u); sub(/".*/, "", u) }
		END { flush() }
	' "$sources_toml"
}

version=
sha=
url=
while read -r v s u; do
	case $v in
	"$want" | "$want".*)
		# The newest pinned release of a MAJOR.MINOR.
		if [ -z "$version" ] || [ "$(printf '%s\n%s\n' "$version" "$v" | sort -V | tail -n1)" = "$v" ]; then
			version=$v sha=$s url=$u
		fi
		;;
	esac
done < <(pins)
[ -n "$version" ] || fail 64 "Slurm $want is not pinned in $sources_toml (pinned: $(pins | awk '{printf "%s ", $1}')): add [slurm.\"$want\"] with its publisher's sha256"

sources_dir=${SLURM_SOURCES_DIR:-$repo/../shared/sources}
file=slurm-${version//./-}-1.tar.gz
tarball=$sources_dir/$file
if [ ! -f "$tarball" ]; then
	# Not in the sources folder: the pinned URL (or the site's mirror), verified before use.
	url=${SLURM_SOURCE_URL:-$url}
	[ -n "$url" ] || fail 66 "Slurm $version: no $tarball and no url pinned for it in $sources_toml (set SLURM_SOURCES_DIR to the folder holding SchedMD's $file)"
	download_dir=${SLURM_DOWNLOAD_DIR:-/var/cache/slurm-e2e/sources}
	tarball=$download_dir/$file
	if [ ! -f "$tarball" ] || [ "$(sha256_of "$tarball")" != "$sha" ]; then
		mkdir -p "$download_dir" || fail 66 "Slurm $version: cannot create $download_dir (set SLURM_DOWNLOAD_DIR)"
		log "Slurm $version: no $sources_dir/$file; downloading $url"
		if ! curl -fsSL --retry 2 --connect-timeout 10 --max-time 600 -o "$tarball.part" "$url"; then
			rm -f "$tarball.part"
			fail 66 "Slurm $version: no $sources_dir/$file, and $url could not be downloaded (set SLURM_SOURCES_DIR to a folder holding it, or SLURM_SOURCE_URL to a mirror)"
		fi
		got=$(sha256_of "$tarball.part")
		if [ "$got" != "$sha" ]; then
			rm -f "$tarball.part"
			fail 65 "checksum mismatch for $url: $sources_toml pins $sha for Slurm $version, the download has $got; it was deleted and nothing was installed"
		fi
		mv -f "$tarball.part" "$tarball"
		log "Slurm $version: $tarball verified (sha256 $sha)"
	fi
fi
if [ "$fetch_only" = true ]; then
	got=$(sha256_of "$tarball")
	[ "$got" = "$sha" ] || fail 65 "checksum mismatch for $tarball: $sources_toml pins $sha for Slurm $version, the file has $got; nothing was installed"
	echo "$tarball"
	exit 0
fi

require_root
export SLURM_VERSION=$version
SLURM_BUILD_CACHE=${SLURM_BUILD_CACHE:-/var/cache/slurm-e2e/slurm-builds}
# The host's /usr/lib/systemd belongs to Debian's packages; the units stay under the prefix.
export SLURM_INSTALL_UNITS=false
export SLURM_RECORD_FLAGS=false

mapfile -t flags < <(slurm_configure_flags)
cached_tar=$SLURM_BUILD_CACHE/slurm-$version-$(slurm_build_key "$sha" "${flags[@]}").tar
if [ "$cache_only" = true ] && [ -f "$cached_tar" ]; then
	log "Slurm $version already built: $cached_tar"
	echo "$cached_tar"
	exit 0
fi
if [ "$cache_only" = false ] && [ -f "$PREFIX/.slurm-build" ] && grep -qx "version=$version" "$PREFIX/.slurm-build"; then
	if grep -qx "key=$(slurm_build_key "$sha" "${flags[@]}")" "$PREFIX/.slurm-build"; then
		log "Slurm $version already in place in $PREFIX"
		echo "$PREFIX"
		exit 0
	fi
fi

got=$(sha256_of "$tarball")
[ "$got" = "$sha" ] || fail 65 "checksum mismatch for $tarball: $sources_toml pins $sha for Slurm $version, the file has $got; nothing was installed"

if ! command -v gcc >/dev/null || [ -z "$(pmix_prefix || true)" ] || ! dpkg-query -W libjwt-dev >/dev/null 2>&1; then
	install_build_deps >&2
fi
build=$(mktemp -d /var/tmp/slurm-src.XXXXXX)
trap 'rm -rf "$build"' EXIT
tar -xaf "$tarball" -C "$build" --strip-components=1
if [ "$cache_only" = true ]; then
	SLURM_BUILD_ONLY=true build_slurm "$build" "$sha" >&2
	[ -f "$cached_tar" ] || fail 1 "the build left no $cached_tar"
	log "Slurm $version built into $cached_tar; nothing installed" >&2
	echo "$cached_tar"
	exit 0
fi
build_slurm "$build" "$sha" >&2
getent group slurm >/dev/null || groupadd -r slurm
getent passwd slurm >/dev/null || useradd -r -g slurm -d /var/lib/slurm -s /sbin/nologin slurm
have=$("$PREFIX/sbin/slurmd" -V | awk '{print $2}')
[ "$have" = "$version" ] || fail 1 "the build reports Slurm '$have', not $version"
log "Slurm $version in place in $PREFIX" >&2
echo "$PREFIX"
