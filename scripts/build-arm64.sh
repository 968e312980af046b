#!/usr/bin/env bash
# Builds slurm-node-agent (both programs) for aarch64-unknown-linux-gnu with a glibc 2.34
# floor (Amazon Linux 2023 and RHEL 9 on Graviton), then proves the result: prints the
# newest GLIBC_ symbol version each program needs (fails above 2.34) and runs
# `--version`, `config show` on a settings file and `check` on an NHC file under
# qemu-aarch64. The recipe of /work/shared/PROVING-GROUND.md: the host's rustup has only
# the x86_64 standard library, so the build runs chrooted in a Debian unstable root
# (mmdebstrap) with its rustc (1.97) and libstd-rust-dev:arm64, linked by cargo-zigbuild
# with zig (both wheels from PyPI) against glibc 2.34's symbols.
#
#   sudo scripts/build-arm64.sh [--profile release|dev]
#
# Environment:
#   ARM64_ROOT  the build root, kept between runs with its target folder (default
#               /var/tmp/slurm-node-agent-arm64); remove it to start clean
# Needs root (mmdebstrap, chroot, mounts), the Debian mirror and PyPI, and the crates of
# Cargo.lock in ~/.cargo/registry (cargo fetch), which the root uses read-write.
# Prints where the programs are. Not in CI: a clean release build takes 12 to 16 minutes
# on 2 cores.
# Hooks and the chroot command are expanded by mmdebstrap and bash -c, not here.
# shellcheck disable=SC2016
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
case ${1:-} in
--profile) profile=${2:?--profile needs a value} ;;
'') ;;
*) echo "build-arm64.sh: unknown argument '$1'" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "build-arm64.sh: must run as root" >&2; exit 1; }
ROOT=${ARM64_ROOT:-/var/tmp/slurm-node-agent-arm64}
TRIPLE=aarch64-unknown-linux-gnu
FLOOR=2.34
ZIGLANG=0.17.0
ZIGBUILD=0.24.0
log() { printf 'build-arm64: %s\n' "$*" >&2; }
started=$(date +%s)

if [ ! -x "$ROOT/usr/bin/rustc" ]; then
	rm -rf "$ROOT"
	log "making the Debian unstable root $ROOT"
	mmdebstrap --quiet --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' \
		--architectures=amd64,arm64 \
		--include=rustc,cargo,libstd-rust-dev:arm64,gcc-aarch64-linux-gnu,libc6-dev:arm64,qemu-user,python3-pip,binutils-aarch64-linux-gnu,ca-certificates \
		sid "$ROOT"
	log "root made in $(($(date +%s) - started)) s: $(chroot "$ROOT" rustc --version)"
fi
if [ ! -x "$ROOT/usr/local/bin/cargo-zigbuild" ]; then
	# This machine's trusted roots (a proxy's CA may be among them), for pip in the root.
	cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/build-host.crt"
	cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
	chroot "$ROOT" env -i PATH=/usr/bin:/bin HOME=/root pip install --quiet \
		--break-system-packages --cert /etc/ssl/certs/build-host.crt \
		"ziglang==$ZIGLANG" "cargo-zigbuild==$ZIGBUILD"
fi

# The workspace's tracked files, as they are now (the commit named by --version).
rm -rf "$ROOT/build/src"
mkdir -p "$ROOT/build/src" "$ROOT/build/target" "$ROOT/root/.cargo/registry"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$ROOT/build/src"
commit=$(git rev-parse --short=12 HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit=$commit-dirty

build_started=$(date +%s)
unshare --mount --fork --pid --mount-proc="$ROOT/proc" bash -c '
	set -e
	mount --bind "$HOME/.cargo/registry" "$1/root/.cargo/registry"
	exec chroot "$1" env HOME=/root PATH=/usr/local/bin:/usr/bin:/bin \
		SLURM_NODE_AGENT_COMMIT="$2" CARGO_TARGET_DIR=/build/target \
		sh -c "cd /build/src && nice -n 10 cargo zigbuild --offline --locked --profile $3 \
			--target $4.$5 -p slurm-node-agent --bins"
' build-arm64 "$ROOT" "$commit" "$profile" "$TRIPLE" "$FLOOR"
log "built in $(($(date +%s) - build_started)) s ($profile)"

dir=$profile
[ "$profile" = dev ] && dir=debug
out=$ROOT/build/target/$TRIPLE/$dir
for prog in slurm-node-agent slurm-node-agent-healthcheck; do
	newest=$(chroot "$ROOT" aarch64-linux-gnu-objdump -T "/build/target/$TRIPLE/$dir/$prog" |
		grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)
	echo "$prog: needs $newest at most ($(file -b "$out/$prog" | cut -d, -f1,2))"
	[ "$(printf '%s\n' "GLIBC_$FLOOR" "$newest" | sort -V | tail -n1)" = "GLIBC_$FLOOR" ] ||
		{ log "$prog needs $newest, above the floor GLIBC_$FLOOR"; exit 1; }
done

# Under qemu-aarch64, with the arm64 glibc of the root (-L).
work=$(mktemp -d "$ROOT/tmp/prove.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/conf.d" "$work/checks.d"
printf '[node]\nname = "n1"\n' >"$work/agent.toml"
printf '* || check_fs_mount_rw -f /\n* || check_hw_cpuinfo 1\n' >"$work/nhc.conf"
w=/tmp/$(basename "$work")
qemu() { chroot "$ROOT" qemu-aarch64 -L /usr/aarch64-linux-gnu "/build/target/$TRIPLE/$dir/$1" "${@:2}"; }
qemu slurm-node-agent --version
qemu slurm-node-agent-healthcheck --version
qemu slurm-node-agent config show --no-imds --config "$w/agent.toml" --config-dir "$w/conf.d" | grep -E '^node\.name'
qemu slurm-node-agent check --no-act --config "$w/agent.toml" --config-dir "$w/conf.d" \
	--nhc-conf "$w/nhc.conf" --checks-dir "$w/checks.d" --node-name n1
log "done in $(($(date +%s) - started)) s; the programs: $out"
