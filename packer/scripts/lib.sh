# shellcheck shell=bash
# Helpers shared by the provisioning steps packer/scripts/NN-*.sh. Sourced, never run.
#
# Contract with the steps (environment, set by the Packer template or by
# `slurm-image-builder build --target local`; after 10-base.sh also read back from
# /etc/slurm-image/build-info so that acceptance checks can run on demand):
#   IMAGE_STAGING  folder with scripts/, files/, agent/ and sources/ (pre-fetched tarballs)
#   IMAGE_OS IMAGE_ARCH SLURM_VERSION SLURM_SOURCE SLURM_URL SLURM_SHA256 SLURM_AUTH
#   SLURM_VERSIONS SLURM_DEFAULT SLURM_URL_<version> SLURM_SHA256_<version> (several
#   versions side by side; <version> with underscores: SLURM_URL_25_11_6)
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

# Signing keys of packages that come with a detached signature and no checksum list (AWS's
# "latest" agent packages): packer/files/keys/<id>.fpr holds the pinned fingerprint (see
# pinned_fingerprint), <id>.asc the public key where it ships with the recipe, or
# <id>.key-url where the publisher serves it (its fingerprint is checked before use).
: "${SIGNING_KEYS_DIR:=$IMAGE_STAGING/files/keys}"

# pinned_fingerprint FILE: print the fingerprint pinned in FILE, in capitals. The format
# (`slurm-image-builder validate` reads it the same way, imagebuilder/src/keys.rs): one
# line of 40 hex digits, in any case, spaces between groups allowed, an optional 0x prefix;
# '#' starts a comment (a whole line or the rest of one); blank lines, a UTF-8 byte order
# mark and CRLF line ends are ignored. Otherwise returns 1 with FILE, the line and what is
# wrong on stderr.
pinned_fingerprint() {
	local file=$1
	if [ ! -r "$file" ]; then
		printf '%s: no pinned signing key fingerprint: the file does not exist or cannot be read (write the key'"'"'s 40-hex-digit fingerprint there)\n' "$file" >&2
		return 1
	fi
	LC_ALL=C awk -v file="$file" '
		NR == 1 && substr($0, 1, 3) == "\357\273\277" { $0 = substr($0, 4) }
		{
			sub(/\r$/, "")
			text = $0
			sub(/#.*/, "", text)
			sub(/^[ \t]+/, "", text)
			sub(/[ \t]+$/, "", text)
			if (text == "") next
			if (fpr != "") {
				printf "%s, line %d: a second fingerprint (the first is on line %d); pin one key per file\n", file, NR, at > "/dev/stderr"
				bad = 1
				exit
			}
			hex = text
			gsub(/[ \t]/, "", hex)
			if (hex ~ /^0[xX]/) hex = substr(hex, 3)
			if (hex ~ /[^0-9A-Fa-f]/) {
				printf "%s, line %d: \"%s\" is not a fingerprint: only hex digits may come before a # comment (spaces and a 0x prefix are ignored)\n", file, NR, text > "/dev/stderr"
				bad = 1
				exit
			}
			if (length(hex) != 40) {
				printf "%s, line %d: \"%s\" has %d hex digits; a fingerprint has 40\n", file, NR, text, length(hex) > "/dev/stderr"
				bad = 1
				exit
			}
			fpr = toupper(hex)
			at = NR
		}
		END {
			if (bad) exit 1
			if (fpr == "") {
				printf "%s: no pinned signing key fingerprint: no line of 40 hex digits (lines starting with # are comments)\n", file > "/dev/stderr"
				exit 1
			}
			print fpr
		}
	' "$file"
}

# dearmor: an ASCII-armored OpenPGP block on stdin as binary on stdout (gpgv reads binary
# keyrings; gpg itself is not on every minimal root, gpgv is: apt and dnf use it).
dearmor() {
	sed -n '/^-----BEGIN PGP PUBLIC KEY BLOCK-----/,/^-----END PGP PUBLIC KEY BLOCK-----/p' |
		sed '1d;$d' | awk 'NF == 0 { body = 1; next } body && !/^=/' | base64 -d
}

# verify_signature NAME FILE SIG KEYID: check FILE against the detached signature SIG,
# made by the key pinned as KEYID in $SIGNING_KEYS_DIR. Returns 1 with the reason on
# stderr when it is not a good signature by that key. A signature by the pinned key whose
# expiry date has passed is accepted (and said so): AWS extends the expiry of the same key
# (same fingerprint) and republishes it.
verify_signature() {
	local name=$1 file=$2 sig=$3 id=$4 fpr keyring key url status primary why
	if ! fpr=$(pinned_fingerprint "$SIGNING_KEYS_DIR/$id.fpr" 2>&1); then
		printf '[%s] %s: %s\n' "$STEP" "$name" "$fpr" >&2
		return 1
	fi
	if ! command -v gpgv >/dev/null 2>&1; then
		printf '[%s] %s: gpgv is not installed: cannot check the signature\n' "$STEP" "$name" >&2
		return 1
	fi
	key=$SIGNING_KEYS_DIR/$id.asc
	if [ ! -r "$key" ]; then
		url=$(grep -v '^[[:space:]]*#' "$SIGNING_KEYS_DIR/$id.key-url" 2>/dev/null | head -n1) || true
		if [ -z "$url" ]; then
			printf '[%s] %s: no public key %s and no %s.key-url\n' "$STEP" "$name" "$key" "$id" >&2
			return 1
		fi
		key=$(mktemp)
		if ! curl -fsSL --retry 2 --connect-timeout 10 -o "$key" "$url"; then
			rm -f "$key"
			printf '[%s] %s: cannot download its signing key from %s\n' "$STEP" "$name" "$url" >&2
			return 1
		fi
	fi
	keyring=$(mktemp)
	if grep -q -- '-----BEGIN PGP PUBLIC KEY BLOCK-----' "$key"; then
		dearmor <"$key" >"$keyring" 2>/dev/null || true
	else
		cat "$key" >"$keyring"
	fi
	[ "$key" = "$SIGNING_KEYS_DIR/$id.asc" ] || rm -f "$key"
	if [ ! -s "$keyring" ]; then
		rm -f "$keyring"
		printf '[%s] %s: its signing key is empty or not an OpenPGP public key\n' "$STEP" "$name" >&2
		return 1
	fi
	# The status lines on stdout; gpgv's own words (stderr) go into the message.
	status=$(gpgv --status-fd 1 --keyring "$keyring" "$sig" "$file" 2>"$keyring.err") || true
	why=$(tr '\n' ' ' <"$keyring.err")
	rm -f "$keyring" "$keyring.err"
	primary=$(printf '%s\n' "$status" | awk '$2 == "VALIDSIG" { print (NF >= 12 ? $12 : $3); exit }')
	if printf '%s\n' "$status" | grep -q '^\[GNUPG:\] REVKEYSIG'; then
		why="the signing key is revoked. $why"
		primary=
	elif printf '%s\n' "$status" | grep -q '^\[GNUPG:\] EXPSIG'; then
		why="the signature itself has expired. $why"
		primary=
	elif [ -n "$primary" ] && [ "$primary" != "$fpr" ]; then
		why="signed by the key $primary, not the pinned one. $why"
	fi
	if [ "$primary" != "$fpr" ]; then
		printf '[%s] %s: %s is not a good signature by the pinned key %s (%s): %s\n' \
			"$STEP" "$name" "$(basename "$sig")" "$fpr" "$SIGNING_KEYS_DIR/$id.fpr" "${why:-no signature found}" >&2
		return 1
	fi
	if printf '%s\n' "$status" | grep -q '^\[GNUPG:\] EXPKEYSIG'; then
		log "$name: good signature by the pinned key $fpr (this copy of the key is past its expiry date; the fingerprint is what is pinned)"
	else
		log "$name: good signature by the pinned key $fpr"
	fi
}

# fetch_signed NAME URL DEST KEYID: download URL to DEST and its detached signature URL.sig
# to DEST.sig, and check them with verify_signature. A bad signature stops the step, and
# nothing is left at DEST. 2 when the URL cannot be reached.
fetch_signed() {
	local name=$1 url=$2 dest=$3 id=$4
	mkdir -p "$(dirname "$dest")"
	probe "$url" || return 2
	log "$name: downloading $url and its signature"
	rm -f "$dest" "$dest.sig"
	if ! curl -fsSL --retry 2 --connect-timeout 10 -o "$dest.part" "$url"; then
		rm -f "$dest.part"
		return 2
	fi
	# The package came: a signature that does not is a missing signature, not a network
	# problem (and never a reason to skip the component).
	if ! curl -fsSL --retry 2 --connect-timeout 10 -o "$dest.sig" "$url.sig"; then
		rm -f "$dest.part" "$dest.sig"
		die "$name: no detached signature at $url.sig (the package itself downloaded); it was not installed."
	fi
	if ! verify_signature "$name" "$dest.part" "$dest.sig" "$id"; then
		rm -f "$dest.part" "$dest.sig"
		die "$name from $url failed its signature check (above); it was not installed. If AWS has rotated the key, pin the new fingerprint from AWS's documentation in $SIGNING_KEYS_DIR/$id.fpr."
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
