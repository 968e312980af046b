# shellcheck shell=bash
# Helpers shared by the provisioning steps packer/scripts/NN-*.sh. Sourced, never run.
#
# Contract with the steps (environment, set by the Packer template or by
# `slurm-image-builder build --target local`; after 10-base.sh also read back from
# /etc/slurm-image/build-info so that acceptance checks can run on demand):
#   IMAGE_STAGING  folder with scripts/, files/, agent/ and sources/ (pre-fetched tarballs)
#   IMAGE_OS IMAGE_ARCH SLURM_VERSION SLURM_SOURCE SLURM_URL SLURM_SHA256 SLURM_AUTH
#   EFA_INSTALLER_VERSION EFA_INSTALLER_URL EFA_INSTALLER_SHA256 LUSTRE_CLIENT
#   NVIDIA_DRIVER_VERSION NVIDIA_DCGM CLOUDWATCH_AGENT IMAGE_REGION AGENT_VERSION ALLOW_SKIPS
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

# Bounds of the waits on a freshly launched builder, where cloud-init and unattended
# upgrades hold the package lock for minutes (seconds; overridable by the environment).
: "${CLOUD_INIT_TIMEOUT:=900}"
: "${PKG_LOCK_TIMEOUT:=600}"
: "${PKG_RETRIES:=4}"
: "${PKG_RETRY_DELAY:=15}"

# wait_for_cloud_init: once per boot, wait (bounded by CLOUD_INIT_TIMEOUT) until
# cloud-init has finished, so that its package runs do not collide with ours. Nothing to
# wait for without cloud-init (a chroot, a container). Errors in cloud-init's own modules
# are reported, not fatal: the image build does not depend on them.
wait_for_cloud_init() {
	local rc=0 marker=${CLOUD_INIT_MARKER:-/run/slurm-image-cloud-init-waited}
	[ ! -e "$marker" ] || return 0
	if ! command -v cloud-init >/dev/null 2>&1; then
		return 0
	fi
	log "waiting for cloud-init to finish (at most ${CLOUD_INIT_TIMEOUT}s)"
	timeout "$CLOUD_INIT_TIMEOUT" cloud-init status --wait >/dev/null 2>&1 || rc=$?
	case $rc in
	0) log "cloud-init finished" ;;
	124) die "cloud-init still running after ${CLOUD_INIT_TIMEOUT}s (cloud-init status --wait): see /var/log/cloud-init-output.log on the build instance, or raise CLOUD_INIT_TIMEOUT" ;;
	2) log "cloud-init finished with recoverable errors (cloud-init status --long shows them); going on" ;;
	*) log "cloud-init finished with errors (exit $rc; cloud-init status --long shows them); going on" ;;
	esac
	: >"$marker" 2>/dev/null || true
}

# pkg_failure_kind FILE: classify a failed apt/dnf run from its output:
#   lock       another process holds the package lock (cloud-init, unattended upgrades)
#   transient  the network or a mirror failed (DNS, timeouts, 5xx, a mirror mid-sync)
#   permanent  anything else (an unknown package, a conflict): retrying will not help
pkg_failure_kind() {
	if grep -Eqi 'could not get lock|unable to acquire the dpkg frontend lock|unable to lock (the )?(directory|administration)|is held by process|waiting for process with pid|another app is currently holding the yum lock|lock .* is held' "$1"; then
		echo lock
	elif grep -Eqi 'temporary failure (in name )?resolving|could not resolve|could not connect|connection (timed out|reset|refused)|failed to fetch|hash sum mismatch|cannot download|curl error|failed to download metadata|cannot find a valid baseurl|errors during downloading metadata|503 +service unavailable|502 +bad gateway|timed out|network is unreachable|mirror sync in progress' "$1"; then
		echo transient
	else
		echo permanent
	fi
}

# pkg_run WHAT CMD...: run a package manager command, waiting for the package lock
# (bounded by PKG_LOCK_TIMEOUT) and retrying lock and transient failures up to PKG_RETRIES
# times; dies naming which kind of failure it was and what to do about it.
pkg_run() {
	local what=$1 out kind attempt=1 rc
	shift
	wait_for_cloud_init
	out=$(mktemp)
	while :; do
		rc=0
		"$@" >"$out" 2>&1 || rc=$?
		cat "$out" >&2
		if [ "$rc" -eq 0 ]; then
			rm -f "$out"
			return 0
		fi
		kind=$(pkg_failure_kind "$out")
		if [ "$kind" = permanent ] || [ "$attempt" -ge "$PKG_RETRIES" ]; then
			rm -f "$out"
			case $kind in
			lock) die "$what: the package lock stayed held by another process (cloud-init or unattended upgrades) for $attempt attempts of up to ${PKG_LOCK_TIMEOUT}s each; see the holder above, or raise PKG_LOCK_TIMEOUT" ;;
			transient) die "$what: network or mirror failure, $attempt attempts: see the message above; check the build instance's route to the package mirrors (NAT, proxy, VPC endpoints)" ;;
			*) die "$what: see the package manager's message above (not a lock or network problem; retrying would not help)" ;;
			esac
		fi
		log "$what: $kind failure (attempt $attempt of $PKG_RETRIES); retrying in ${PKG_RETRY_DELAY}s"
		sleep "$PKG_RETRY_DELAY"
		attempt=$((attempt + 1))
	done
}

# apt_get ARGS...: apt-get, non-interactive, waiting up to PKG_LOCK_TIMEOUT for the dpkg
# and lists locks (apt's DPkg::Lock::Timeout, apt >= 1.9.11).
apt_get() {
	DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$PKG_LOCK_TIMEOUT" "$@"
}

# dnf_cmd ARGS...: dnf, bounded: dnf waits for a lock held by another dnf without a limit
# of its own, so `timeout` bounds each try (exit 124 is reported as a lock wait).
dnf_cmd() {
	local rc=0
	timeout "$PKG_LOCK_TIMEOUT" dnf "$@" || rc=$?
	if [ "$rc" -eq 124 ]; then
		echo "dnf did not finish within ${PKG_LOCK_TIMEOUT}s: the package lock is held by process of another dnf, or dnf hangs"
	fi
	return "$rc"
}

# pkg_install PKG...: install what is missing; does nothing (no index refresh) when all are there.
pkg_install() {
	local missing list
	missing=$(pkg_missing "$@")
	[ -n "$missing" ] || return 0
	list=$(tr '\n' ' ' <<<"$missing")
	list=${list% }
	log "installing: $list"
	if [ "$(os_family)" = deb ]; then
		pkg_run "apt-get update" apt_get update -qq
		# shellcheck disable=SC2086 # package names are words
		pkg_run "installing $list" apt_get install -y -qq --no-install-recommends $missing
	else
		# shellcheck disable=SC2086
		pkg_run "installing $list" dnf_cmd install -y -q $missing
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
