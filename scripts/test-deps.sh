#!/usr/bin/env bash
# Installs every Debian and PyPI package the test suite needs, on Debian 12 (bookworm),
# as root. Idempotent and quiet: what is already there is left alone, `apt-get update`
# runs at most once, and only when a package is missing.
#
#   sudo scripts/test-deps.sh
#
# Environment:
#   MOTO_VENV  where moto is installed when no moto 5.2 is importable by python3
#              (default /opt/slurm-e2e/moto-venv)
#   BIN_DIR    where moto_server is then linked (default /usr/local/bin)
#
# The Rust toolchain (rustup, cargo) is not installed here.
set -euo pipefail

APT_PACKAGES=(
  # Slurm 22.05 (Debian 12's; SLURM_E2E_VERSION=22.05) and munge: the tests start munged,
  # slurmctld and slurmd themselves.
  slurmctld slurmd slurm-client munge
  # systemd 252 (`systemd --user` as a confined Manager), its user bus, D-Bus tools.
  systemd dbus dbus-user-session
  # unshare, flock, mount, losetup; ip and network namespaces; ps.
  util-linux mount iproute2 procps
  # Node-local scratch on instance storage (agent/src/scratch): btrfs, striped over several
  # loop devices that the tests present as instance store disks (this kernel has no md).
  btrfs-progs
  # Image building and checks: packer, mmdebstrap, ext4 and qcow2 images, FUSE.
  packer mmdebstrap e2fsprogs qemu-utils fuse3
  # Fleet tests (tests/tests/fleet.rs): node containers with systemd as PID 1, the fleet's
  # DNS server (dnsmasq-base: the binary without a system service that would take port 53),
  # and the shared file system stand-in (sshfs served by sshd inside the fleet namespace).
  systemd-container dnsmasq-base openssh-server sshfs
  # Script linting and the benchmarks (/usr/bin/time measures peak RSS).
  shellcheck hyperfine time
  # Logs and metrics (issue 43): promtool checks every Prometheus textfile the suite
  # produces; logrotate rotates the exported journal as the image does; the CloudWatch
  # agent's configuration is validated against its JSON Schema (draft-04).
  prometheus logrotate python3-jsonschema
  # Signature checks of AWS's agent packages in the provisioning steps (gpgv), and the
  # tests' stand-in signing keys (gpg, gpg-agent).
  gpg gpgv gpg-agent
  # moto's server runs in a Python virtual environment when it is not installed yet.
  python3 python3-venv
  # Building the workspace (C code in aws-lc-sys, linking).
  build-essential pkg-config ca-certificates curl
  # Building Slurm from SchedMD's tarballs (scripts/slurm-build.sh; the same libraries as
  # the image's build, packer/scripts/lib-slurm.sh install_build_deps).
  dpkg-dev libmunge-dev libssl-dev libpam0g-dev libhwloc-dev libpmix-dev libjson-c-dev
  libjwt-dev libhttp-parser-dev liblz4-dev libyaml-dev libdbus-1-dev libreadline-dev bzip2
  # The agent's .rpm read and linted (tests/tests/packages.rs), and packages unpacked.
  rpm rpm2cpio rpmlint
)
# The agent's packagers (scripts/package.sh), from crates.io, pinned: `cargo install
# --locked` builds both in about 9 minutes on 2 busy cores (measured: 539 s), once per
# machine; skipped when the version is already installed.
CARGO_TOOLS=(cargo-deb@3.8.0 cargo-generate-rpm@0.21.1)
MOTO_SPEC='moto[server]~=5.2.0'
MOTO_VENV=${MOTO_VENV:-/opt/slurm-e2e/moto-venv}
BIN_DIR=${BIN_DIR:-/usr/local/bin}

log() { printf 'test-deps: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (apt-get, /usr/local/bin)"
  exit 1
fi

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done

munge_was_installed=0
installed munge && munge_was_installed=1

if ((${#missing[@]} > 0)); then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The tests run their own munged on munge's default socket. On a machine with systemd
# as PID 1, installing munge starts the system's munged there: stop the one this script
# caused, and only warn about one that was already running.
if [[ -d /run/systemd/system ]] && systemctl is-active --quiet munge.service 2>/dev/null; then
  if ((munge_was_installed == 0)); then
    log "stopping and disabling munge.service, started by its installation (the tests run their own munged)"
    systemctl disable --now --quiet munge.service
  else
    log "warning: munge.service is running; the tests refuse to share its socket. Stop it first: systemctl stop munge.service"
  fi
fi

for tool in "${CARGO_TOOLS[@]}"; do
  name=${tool%@*} version=${tool#*@}
  if ! "$name" --version 2>/dev/null | grep -qF " $version"; then
    command -v cargo >/dev/null || { log "cargo is needed to install $tool"; exit 1; }
    log "installing $tool (cargo install --locked; both take about 9 minutes on 2 cores)"
    cargo install --quiet --locked "$tool"
  fi
done

moto_ok() {
  # $1: a python interpreter
  "$1" - <<'EOF' 2>/dev/null
import sys
import moto, flask  # flask: moto[server] is installed, not only moto
sys.exit(0 if moto.__version__.startswith("5.2.") else 1)
EOF
}

if command -v moto_server >/dev/null && moto_ok python3; then
  : # moto 5.2 with its server, importable by the python3 on PATH
elif [[ -x $MOTO_VENV/bin/python ]] && moto_ok "$MOTO_VENV/bin/python"; then
  ln -sf "$MOTO_VENV/bin/moto_server" "$BIN_DIR/moto_server"
else
  log "installing $MOTO_SPEC into $MOTO_VENV"
  python3 -m venv "$MOTO_VENV"
  "$MOTO_VENV/bin/pip" install -q --disable-pip-version-check "$MOTO_SPEC"
  moto_ok "$MOTO_VENV/bin/python" || { log "moto 5.2 did not install into $MOTO_VENV"; exit 1; }
  ln -sf "$MOTO_VENV/bin/moto_server" "$BIN_DIR/moto_server"
fi

command -v moto_server >/dev/null || { log "moto_server is not on PATH (it was linked into $BIN_DIR)"; exit 1; }
log "ok"
