# shellcheck shell=bash
# Helpers shared by the provisioning steps packer/scripts/NN-*.sh. Sourced, never run.
#
# Contract with the steps (environment, set by the Packer template or by
# `slurm-image-builder build --target local`; after 10-base.sh also read back from
# /etc/slurm-image/build-info so that acceptance checks can run on demand):
#   IMAGE_STAGING  folder with scripts/, files/, agent/ and sources/ (pre-fetched tarballs)
#   IMAGE_OS IMAGE_ARCH SLURM_VERSION SLURM_SOURCE SLURM_URL SLURM_SHA256 SLURM_AUTH
#   EFA_INSTALLER_VERSION EFA_INSTALLER_URL EFA_INSTALLER_SHA256 LUSTRE_CLIENT
#   NVIDIA_DRIVER_VERSION NVIDIA_DCGM AGENT_VERSION ALLOW_SKIPS
#
# Every step is idempotent: it checks what is already in place and does only the rest.

STEP=${STEP:-$(basename "$0" .sh)}
# shellcheck disable=SC2034 # used by the steps that source this file
IMAGE_LIB_DIR=/usr/local/lib/slurm-image
BUILD_INFO_DIR=/etc/slurm-image
BUILD_INFO=$BUILD_INFO_DIR/build-info
SKIPPED_FILE=$BUILD_INFO_DIR/skipped

log() { printf '[%s] %s\n' "$STEP" "$*"; }

# die MESSAGE: stop the step with a message naming the step and what to do.
die() {
	printf '[%s] FAILED: %s\n' "$STEP" "$*" >&2
	exit 1
}

on_error() {
	local rc=$? line=$1 cmd=$2
	# Inside $(...) only leave the subshell: the caller's command fails and reports.
	[ "$BASH_SUBSHELL" -eq 0 ] || exit "$rc"
	printf '[%s] FAILED: command '%s' exited %s (line %s). Fix the cause shown above and run the step again; it is idempotent.\n' \
		"$STEP" "$cmd" "$rc" "$line" >&2
	exit "$rc"
}
trap 'on_error "$LINENO" "$BASH_COMMAND"' ERR

# Read the recorded build settings; values already in the environment win.
load_build_info() {
	local key value
	[ -r "$BUILD_INFO" ] || return 0
	while IFS='=' read -r key value; do
		case $key in
		'' | \#*) continue ;;
		*[!A-Z0-9_]*) continue ;;
		esac
		if [ -z "${!key+x}" ]; then
			printf -v "$key" '%s' "$value"
			export "${key?}"
		fi
	done <"$BUILD_INFO"
}
load_build_info

: "${IMAGE_STAGING:=/tmp/slurm-image}"
: "${ALLOW_SKIPS:=false}"

require_root() {
	[ "$(id -u)" -eq 0 ] || die "must run as root (Packer runs it through sudo; locally run it in the chroot as root)"
}

# os_family: deb or rpm, from IMAGE_OS or /etc/os-release.
os_family() {
	case ${IMAGE_OS:-} in
	ubuntu-* | debian-*) echo deb ;;
	al2023 | rocky*) echo rpm ;;
	*)
		if command -v dpkg >/dev/null 2>&1; then echo deb; else echo rpm; fi
		;;
	esac
}

# record_skip NAME REASON: remember a skipped part for the acceptance checks.
record_skip() {
	local line="$1: $2"
	mkdir -p "$BUILD_INFO_DIR"
	touch "$SKIPPED_FILE"
	grep -qxF -- "$line" "$SKIPPED_FILE" || printf '%s\n' "$line" >>"$SKIPPED_FILE"
}

# clear_skip NAME: the part is installed now; forget an older skip.
clear_skip() {
	[ -f "$SKIPPED_FILE" ] || return 0
	local tmp
	tmp=$(mktemp "$SKIPPED_FILE.XXXXXX")
	grep -v -- "^$1: " "$SKIPPED_FILE" >"$tmp" || true
	mv -f "$tmp" "$SKIPPED_FILE"
}

was_skipped() { [ -f "$SKIPPED_FILE" ] && grep -q -- "^$1: " "$SKIPPED_FILE"; }

# unreachable NAME URL: a source cannot be reached. With ALLOW_SKIPS=true the part is
# skipped with a message naming it (never silently); otherwise the step fails.
unreachable() {
	local name=$1 url=$2
	if [ "$ALLOW_SKIPS" = true ]; then
		record_skip "$name" "unreachable from here ($url)"
		log "skipped: $name unreachable from here ($url)"
		return 0
	fi
	die "$name unreachable: $url. Check the build instance's network path (NAT, proxy, VPC endpoints) or pre-fetch it into sources_dir."
}

# pkg_missing PKG...: print the packages that are not installed.
pkg_missing() {
	local p
	for p in "$@"; do
		if [ "$(os_family)" = deb ]; then
			dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
		else
			rpm -q "$p" >/dev/null 2>&1 || echo "$p"
		fi
	done
}

# pkg_install PKG...: install what is missing; does nothing (no index refresh) when all are there.
pkg_install() {
	local missing
	missing=$(pkg_missing "$@")
	[ -n "$missing" ] || return 0
	# shellcheck disable=SC2086 # package names are words
	log "installing:" $missing
	if [ "$(os_family)" = deb ]; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update failed: check the package mirrors in /etc/apt/sources.list*"
		# shellcheck disable=SC2086
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing ||
			die "could not install $missing: see apt's message above; check the package names for ${IMAGE_OS:-this OS}"
	else
		# shellcheck disable=SC2086
		dnf install -y -q $missing || die "could not install $missing: see dnf's message above; check the repositories enabled on ${IMAGE_OS:-this OS}"
	fi
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# probe URL: 0 when the host answers (any HTTP status), 1 when it cannot be reached.
probe() {
	curl -sS -o /dev/null --connect-timeout 10 --max-time 30 --head "$1" 2>/dev/null
}

# fetch_verified NAME URL SHA256 DEST: download URL to DEST and check its sha256.
# Reuses DEST or $IMAGE_STAGING/sources/<file> when their checksum matches.
# Returns 2 when the URL cannot be reached (the caller decides: unreachable NAME URL).
fetch_verified() {
	local name=$1 url=$2 sha=$3 dest=$4 cached got
	[ -n "$url" ] || die "no URL for $name: add it to packer/sources.toml (slurm-image-builder passes it)"
	[ -n "$sha" ] || die "no sha256 for $name ($url): add the checksum to packer/sources.toml; unverified downloads are refused"
	case $sha in
	*[!0-9a-f]*) die "sha256 for $name is not 64 lowercase hex digits: '$sha'" ;;
	esac
	[ ${#sha} -eq 64 ] || die "sha256 for $name is not 64 lowercase hex digits: '$sha'"
	if [ -f "$dest" ] && [ "$(sha256_of "$dest")" = "$sha" ]; then
		log "$name: using verified $dest"
		return 0
	fi
	cached="$IMAGE_STAGING/sources/$(basename "$url")"
	if [ -f "$cached" ] && [ "$(sha256_of "$cached")" = "$sha" ]; then
		install -D -m 0644 "$cached" "$dest"
		log "$name: using pre-fetched $cached"
		return 0
	fi
	mkdir -p "$(dirname "$dest")"
	# One quick look first: an unreachable host answers at once instead of after retries.
	probe "$url" || return 2
	log "$name: downloading $url"
	if ! curl -fsSL --retry 2 --connect-timeout 10 -o "$dest.part" "$url"; then
		rm -f "$dest.part"
		return 2
	fi
	got=$(sha256_of "$dest.part")
	if [ "$got" != "$sha" ]; then
		rm -f "$dest.part"
		die "checksum mismatch for $name from $url: expected $sha, got $got. Do not use this file; check the URL and the pin in packer/sources.toml."
	fi
	mv -f "$dest.part" "$dest"
}

# write_if_changed DEST MODE: write stdin to DEST atomically, only when the content differs.
write_if_changed() {
	local dest=$1 mode=$2 tmp
	mkdir -p "$(dirname "$dest")"
	tmp=$(mktemp "$dest.XXXXXX")
	cat >"$tmp"
	if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then
		rm -f "$tmp"
		return 0
	fi
	chmod "$mode" "$tmp"
	mv -f "$tmp" "$dest"
}

# installed_kernels: versions with a module tree under /lib/modules.
installed_kernels() {
	local d
	for d in /lib/modules/*/; do
		[ -d "$d" ] || continue
		basename "$d"
	done
}
