#!/usr/bin/env bash
# 99-acceptance: the image acceptance checks. Last provisioning step, and on demand in a
# finished image: `slurm-image-acceptance` (installed by 10-base.sh).
#
# Expected values come from /etc/slurm-image/build-info (the environment overrides them).
# Parts that the build skipped (ALLOW_SKIPS=true, e.g. sources unreachable from a local
# build) are reported as "not checked" with the reason, never as passed.
# Set ACCEPTANCE_CLEANUP_CHECK=false on a booted node, where logs and keys exist by design.
# Exit status: 0 all checks passed, 1 at least one failed.
set -Eeuo pipefail
STEP=99-acceptance
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

failures=0
pass() { log "ok: $*"; }
fail() {
	log "FAIL: $*"
	failures=$((failures + 1))
}
unchecked=0
not_checked() {
	log "not checked: $*"
	unchecked=$((unchecked + 1))
}

# skipped_reason NAME-PREFIX: the recorded reason when the build skipped that part.
skipped_reason() {
	[ -f "$SKIPPED_FILE" ] || return 1
	grep -m1 -- "^$1" "$SKIPPED_FILE"
}

[ -r "$BUILD_INFO" ] || fail "no build record $BUILD_INFO: 10-base.sh did not run"
PATH=$PATH:/opt/slurm/bin:/opt/slurm/sbin:/usr/local/bin:/usr/local/sbin

# Package updates on a running node (10-base.sh): apt waits for the lock and upgrades
# nothing by itself, as apt itself reads its configuration; needrestart's rule (Perl, as
# needrestart reads it) leaves slurmd, sackd, munge and the agent alone.
if [ "$(os_family)" = deb ]; then
	aptconf=$(apt-config dump 2>/dev/null || true)
	for want in 'DPkg::Lock::Timeout "600";' 'APT::Periodic::Unattended-Upgrade "0";' 'APT::Periodic::Update-Package-Lists "0";'; do
		if grep -qxF "$want" <<<"$aptconf"; then
			pass "package updates: apt has $want"
		else
			fail "package updates: apt-config dump lacks $want (/etc/apt/apt.conf.d/90slurm-node)"
		fi
	done
	nr=/etc/needrestart/conf.d/50-slurm-node.conf
	# shellcheck disable=SC2016
	if out=$(perl -e 'our %nrconf; do $ARGV[0]; die "$ARGV[0]: " . ($@ || $! || "no rules") . "\n" if $@ || !$nrconf{override_rc};
		for my $u (qw(slurmd.service sackd.service munge.service slurm-node-agent.service slurm-node-agent-bootstrap.service)) {
			my @hit = grep { $u =~ $_ } keys %{$nrconf{override_rc}};
			die "$u: no rule\n" unless @hit;
			die "$u: restarted\n" if grep { $nrconf{override_rc}{$_} } @hit;
		}' "$nr" 2>&1); then
		pass "package updates: needrestart never restarts slurmd, sackd, munge, the agent"
	else
		fail "package updates: $nr: $out"
	fi
fi

# Lustre: a module for every installed kernel.
if [ "${LUSTRE_CLIENT:-false}" != true ]; then
	pass "lustre: not requested"
elif reason=$(skipped_reason "FSx Lustre"); then
	not_checked "lustre ($reason)"
else
	kernels=$(installed_kernels)
	if [ -z "$kernels" ]; then
		fail "lustre: no kernel under /lib/modules"
	fi
	for k in $kernels; do
		if find "/lib/modules/$k" -name 'lustre.ko*' -print -quit | grep -q .; then
			pass "lustre: module for kernel $k"
		else
			fail "lustre: no lustre module for kernel $k"
		fi
	done
fi

# EFA: packages and libfabric; the efa provider where the device exists.
if [ -z "${EFA_INSTALLER_VERSION:-}" ]; then
	pass "efa: not requested"
elif reason=$(skipped_reason "EFA installer"); then
	not_checked "efa ($reason)"
else
	fi_info=/opt/amazon/efa/bin/fi_info
	if [ -x "$fi_info" ] && "$fi_info" --version >/dev/null 2>&1; then
		pass "efa: libfabric $("$fi_info" --version | awk '/libfabric:/ {print $2}')"
	else
		fail "efa: libfabric ($fi_info) missing or broken"
	fi
	if [ "$(os_family)" = deb ]; then has_pkg() { dpkg-query -W "$1" >/dev/null 2>&1; }; else has_pkg() { rpm -q "$1" >/dev/null 2>&1; }; fi
	for p in libfabric-aws-bin rdma-core; do
		if has_pkg "$p" || has_pkg "${p%-bin}"; then pass "efa: package $p"; else fail "efa: package $p missing"; fi
	done
	efa_dev=false
	for d in /sys/class/infiniband/*; do
		[ -e "$d/device/driver" ] && [ "$(basename "$(readlink -f "$d/device/driver")")" = efa ] && efa_dev=true
	done
	if [ "$efa_dev" = true ]; then
		if "$fi_info" -p efa >/dev/null 2>&1; then pass "efa: fi_info -p efa"; else fail "efa: fi_info -p efa fails on a host with an EFA device"; fi
	else
		not_checked "efa: fi_info -p efa (no EFA device on this host)"
	fi
fi

# Slurm: the requested version (with several, on a booted node checked with
# ACCEPTANCE_CLEANUP_CHECK=false, any listed one: the agent may have chosen another).
got=$(slurmd -V 2>/dev/null | awk '{print $2}' || true)
if [ "$got" = "${SLURM_VERSION:-}" ]; then
	pass "slurmd -V reports $got"
elif [ "${ACCEPTANCE_CLEANUP_CHECK:-true}" = false ] && [ -n "$got" ] && [[ " ${SLURM_VERSIONS:-} " == *" ${got} "* ]]; then
	pass "slurmd -V reports $got (chosen at boot among ${SLURM_VERSIONS}; the image's default is ${SLURM_VERSION:-})"
else
	fail "slurmd -V reports '${got:-nothing}', expected '${SLURM_VERSION:-}'"
fi

# Several Slurm versions side by side: each in /opt/slurm-<version> with its marker, and
# /opt/slurm a symlink to one of them (the default in the image; on a booted node, with
# ACCEPTANCE_CLEANUP_CHECK=false, the one the agent chose). Each version's slurmd -V is run
# while /opt/slurm points at it, then the symlink goes back, unless slurmd is running:
# the symlink is never switched under a running slurmd.
read -r -a slurm_versions <<<"${SLURM_VERSIONS:-}"
if [ "${#slurm_versions[@]}" -gt 1 ]; then
	slurm_default=${SLURM_DEFAULT:-${SLURM_VERSION:-}}
	link=$(readlink /opt/slurm 2>/dev/null || true)
	if [ "$link" = "slurm-$slurm_default" ]; then
		pass "/opt/slurm -> $link (the default of ${slurm_versions[*]})"
	elif [ "${ACCEPTANCE_CLEANUP_CHECK:-true}" = false ] && [[ " ${slurm_versions[*]} " == *" ${link#slurm-} "* ]]; then
		pass "/opt/slurm -> $link (chosen at boot; the image's default is $slurm_default)"
	else
		fail "/opt/slurm is ${link:+a symlink to }${link:-not a symlink}, expected a symlink to slurm-$slurm_default"
	fi
	for v in "${slurm_versions[@]}"; do
		if grep -qx "version=$v" "/opt/slurm-$v/.slurm-build" 2>/dev/null; then
			pass "slurm $v: /opt/slurm-$v has its marker"
		else
			fail "slurm $v: /opt/slurm-$v has no marker .slurm-build naming $v (half-installed or missing)"
		fi
	done
	if pgrep -x slurmd >/dev/null 2>&1; then
		not_checked "slurmd -V of each version (slurmd is running; /opt/slurm is not switched under it)"
	elif [ "${ACCEPTANCE_CLEANUP_CHECK:-true}" = false ]; then
		# A booted node: bootstrap, the daemon, sackd or slurmrestd may load programs and
		# plugins through /opt/slurm at any moment.
		not_checked "slurmd -V of each version (a booted node: /opt/slurm is switched only by bootstrap)"
	elif [ -n "$link" ]; then
		switch_to() {
			ln -sfn "$1" /opt/.slurm.link.acceptance
			mv -T /opt/.slurm.link.acceptance /opt/slurm
		}
		trap 'switch_to "$link"' EXIT
		for v in "${slurm_versions[@]}"; do
			[ -d "/opt/slurm-$v" ] || continue
			switch_to "slurm-$v"
			got=$(/opt/slurm/sbin/slurmd -V 2>/dev/null | awk '{print $2}' || true)
			if [ "$got" = "$v" ]; then pass "slurm $v: slurmd -V through /opt/slurm reports $got"; else fail "slurm $v: slurmd -V through /opt/slurm reports '${got:-nothing}'"; fi
		done
		switch_to "$link"
		trap - EXIT
	fi
fi

# Slurm's build features: PMIx (`srun --mpi=pmix`), hwloc, JWT, slurmrestd and NVML
# (`AutoDetect=nvml`). Required of source builds (tarball, debian-source); reported for the
# distribution's packages, which decide them. `srun --mpi=list` and starting slurmrestd
# need a configuration: they are checked in a booted node, not here.
slurm_plugin_dir=$(find /opt/slurm/lib/slurm /usr/lib/*-linux-gnu/slurm* /usr/lib64/slurm -maxdepth 1 -name 'select_cons_tres.so' -printf '%h\n' 2>/dev/null | head -n1 || true)
case ${SLURM_SOURCE:-tarball} in tarball | debian-source) feature_missing=fail ;; *) feature_missing=not_checked ;; esac
have_plugin() { [ -n "$slurm_plugin_dir" ] && compgen -G "$slurm_plugin_dir/$1" >/dev/null; }
if have_plugin 'mpi_pmix*.so'; then pass "slurm feature: pmix ($(basename "$(compgen -G "$slurm_plugin_dir/mpi_pmix*.so" | head -n1)"))"; else "$feature_missing" "slurm feature: pmix (no mpi_pmix plugin in ${slurm_plugin_dir:-any plugin folder})"; fi
if have_plugin 'auth_jwt.so'; then pass "slurm feature: jwt (auth_jwt.so)"; else "$feature_missing" "slurm feature: jwt (no auth_jwt plugin)"; fi
# ldd's whole output first: `ldd | grep -q` under pipefail fails when grep exits at the
# first match and ldd, still writing, gets SIGPIPE (seen with 25.11's slurmd).
slurmd_libs=$(ldd "$(command -v slurmd 2>/dev/null || echo /nonexistent)" 2>/dev/null || true)
if [[ $slurmd_libs == *libhwloc* ]]; then pass "slurm feature: hwloc (slurmd links libhwloc)"; else "$feature_missing" "slurm feature: hwloc (slurmd does not link libhwloc)"; fi
if restd=$(command -v slurmrestd 2>/dev/null) && "$restd" -V >/dev/null 2>&1; then pass "slurm feature: slurmrestd ($("$restd" -V 2>&1 | head -n1))"; else "$feature_missing" "slurm feature: slurmrestd (missing or does not run)"; fi
if have_plugin 'gpu_nvml.so'; then
	pass "slurm feature: nvml (gpu_nvml.so)"
elif [ -r /etc/slurm-image/slurm-configure ] && grep -qx -- '--without-nvml' /etc/slurm-image/slurm-configure; then
	not_checked "slurm feature: nvml (built without NVIDIA's development files, which are outside Debian's main archive)"
else
	"$feature_missing" "slurm feature: nvml (no gpu_nvml plugin)"
fi

# Auth: a munge round trip through a private munged (temporary key, removed after), unless
# the image is auth/slurm only; the auth/slurm plugin unless it is auth/munge only (or the
# agent step found none in this Slurm and said so: auth.type = "munge" in the drop-in).
if [ "${SLURM_AUTH:-munge}" != slurm ]; then
	if ! command -v munged >/dev/null 2>&1; then
		fail "munge: munged not installed"
	else
		d=$(mktemp -d /tmp/acceptance-munge.XXXXXX)
		chmod 0755 "$d"
		mkdir -m 0700 "$d/k"
		dd if=/dev/urandom of="$d/k/key" bs=1024 count=1 status=none
		chmod 0400 "$d/k/key"
		if munged --key-file="$d/k/key" --socket="$d/sock" --pid-file="$d/pid" --seed-file="$d/k/seed" --log-file="$d/k/log" 2>"$d/k/err"; then
			# unmunge's whole output first (grep -q under pipefail: see slurmd_libs above).
			decoded=$(munge -S "$d/sock" -s acceptance 2>/dev/null | unmunge -S "$d/sock" 2>/dev/null || true)
			if printf '%s\n' "$decoded" | grep -q '^STATUS: *Success'; then
				pass "munge: round trip"
			else
				fail "munge: round trip failed"
			fi
			kill "$(cat "$d/pid")" 2>/dev/null || true
			for _ in 1 2 3 4 5 6 7 8 9 10; do
				[ -e "$d/pid" ] || break
				sleep 0.1
			done
		else
			fail "munge: munged would not start: $(cat "$d/k/err")"
		fi
		rm -rf "$d"
	fi
fi
if [ "${SLURM_AUTH:-munge}" != munge ]; then
	if [ -n "$(find /usr/lib* /opt/slurm/lib -name auth_slurm.so 2>/dev/null || true)" ]; then
		pass "auth/slurm plugin present"
	elif [ "$SLURM_AUTH" = munge+slurm ] && grep -qx 'type = "munge"' /etc/slurm-node-agent/conf.d/10-image.toml 2>/dev/null; then
		not_checked "auth/slurm plugin (none in this Slurm: the image joins with munge only)"
	else
		fail "auth/slurm plugin missing"
	fi
fi

# checks_load WHAT CMD...: the health checks run by CMD (`--output json` added) load: every
# check file of the image can be used (no check of family "config") and the run ends with
# 0 or 1. The image's default checks judge a booted node (slurmd and munged running, the
# cluster key written), so checks that fail here are listed, not judged.
checks_load() {
	local what=$1 out rc=0 total failing
	shift
	out=$("$@" --output json 2>/dev/null) || rc=$?
	if [ "$rc" -gt 1 ]; then
		fail "$what: exit $rc: $("$@" 2>&1 | tail -n 5)"
	elif printf '%s' "$out" | grep -q '"family":"config"'; then
		fail "$what: a check file cannot be used ($(printf '%s' "$out" | grep -o '"family":"config","origin":"[^"]*"' | head -n 1))"
	else
		total=$(printf '%s' "$out" | grep -o '"status":"' | wc -l)
		failing=$(printf '%s' "$out" | grep -o '"name":"[^"]*","family":"[^"]*","origin":"[^"]*","status":"\(fail\|timeout\)"' |
			sed 's/^"name":"\([^"]*\)".*/\1/' | paste -sd, - || true)
		pass "$what: $total checks load${failing:+; before boot these do not pass yet: $failing}"
	fi
}

# The agent.
if reason=$(skipped_reason "agent: slurm-node-agent binary"); then
	not_checked "slurm-node-agent ($reason)"
elif ! command -v slurm-node-agent >/dev/null 2>&1; then
	fail "slurm-node-agent not installed"
else
	if out=$(slurm-node-agent --version 2>&1); then pass "slurm-node-agent --version: $out"; else fail "slurm-node-agent --version: $out"; fi
	checks_load "slurm-node-agent check --no-act" slurm-node-agent check --no-act
fi
# Slurm's HealthCheckProgram: run as slurmd runs it (no arguments, an empty environment).
if reason=$(skipped_reason "agent: slurm-node-agent-healthcheck binary"); then
	not_checked "slurm-node-agent-healthcheck ($reason)"
elif [ ! -x /usr/bin/slurm-node-agent-healthcheck ]; then
	fail "slurm-node-agent-healthcheck not installed at /usr/bin"
else
	checks_load "slurm-node-agent-healthcheck --no-act (as slurmd runs it)" \
		env -i SLURMD_NODENAME=acceptance /usr/bin/slurm-node-agent-healthcheck --no-act
	# The path of images built before /usr/bin, still in controllers' slurm.conf.
	[ -x /usr/local/bin/slurm-node-agent-healthcheck ] ||
		fail "/usr/local/bin/slurm-node-agent-healthcheck (the old path, a link to /usr/bin) is missing"
fi

# Operator services (65-services.sh).
if reason=$(skipped_reason "amazon-ssm-agent"); then
	not_checked "amazon-ssm-agent ($reason)"
else
	ssm=no
	for u in amazon-ssm-agent.service snap.amazon-ssm-agent.amazon-ssm-agent.service; do
		[ "$(systemctl is-enabled "$u" 2>/dev/null || true)" = enabled ] && ssm=$u
	done
	if [ "$ssm" != no ]; then pass "amazon-ssm-agent enabled ($ssm)"; else fail "amazon-ssm-agent is not installed and enabled"; fi
fi
chrony_conf=/etc/chrony/chrony.conf
[ -f "$chrony_conf" ] || chrony_conf=/etc/chrony.conf
if grep -qs '^server 169.254.169.123 ' "$chrony_conf" && grep -qs '^server fd00:ec2::123 ' "$chrony_conf"; then
	pass "chrony uses the Amazon Time Sync Service ($chrony_conf)"
else
	fail "chrony: $chrony_conf does not name 169.254.169.123 and fd00:ec2::123"
fi
chrony_state=no
for u in chrony.service chronyd.service; do
	[ "$(systemctl is-enabled "$u" 2>/dev/null || true)" = enabled ] && chrony_state=$u
done
if [ "$chrony_state" != no ]; then pass "chrony enabled ($chrony_state)"; else fail "chrony is not enabled"; fi
if [ "${CLOUDWATCH_AGENT:-false}" != true ]; then
	pass "cloudwatch agent: not requested"
elif reason=$(skipped_reason "CloudWatch agent"); then
	not_checked "cloudwatch agent ($reason)"
elif [ "$(systemctl is-enabled slurm-node-agent-cloudwatch-config.service 2>/dev/null || true)" = enabled ] &&
	grep -qs '^config_file = "/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json"' /etc/slurm-node-agent/conf.d/55-cloudwatch.toml; then
	pass "cloudwatch agent: its configuration is rendered at boot (slurm-node-agent-cloudwatch-config.service)"
else
	fail "cloudwatch agent: slurm-node-agent-cloudwatch-config.service not enabled or cloudwatch.config_file not set"
fi

# NVIDIA: services enabled; on a builder with GPUs, devices, Fabric Manager's version.
if [ -z "${NVIDIA_DRIVER_VERSION:-}" ]; then
	pass "nvidia: not requested"
elif reason=$(skipped_reason "NVIDIA CUDA repository"); then
	not_checked "nvidia ($reason)"
else
	for u in nvidia-persistenced.service nvidia-fabricmanager.service nvidia-device-nodes.service; do
		state=$(systemctl is-enabled "$u" 2>/dev/null || true)
		if [ "$state" = enabled ]; then pass "unit $u enabled"; else fail "unit $u is '${state:-unknown}', expected enabled"; fi
	done
	# The packages, with or without GPUs: an exact driver version pins and holds the driver
	# and Fabric Manager at it (60-nvidia.sh).
	case $NVIDIA_DRIVER_VERSION in
	*.*)
		br=${NVIDIA_DRIVER_VERSION%%.*}
		if [ "$(os_family)" = deb ]; then
			pkgs=("nvidia-driver-$br-server-open" "nvidia-fabricmanager-$br")
			held=$(apt-mark showhold 2>/dev/null || true)
		else
			pkgs=(nvidia-driver nvidia-fabric-manager)
			held=$(dnf versionlock list 2>/dev/null || true)
		fi
		vers=()
		for p in "${pkgs[@]}"; do
			if [ "$(os_family)" = deb ]; then
				v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
			else
				v=$(rpm -q --qf '%{VERSION}' "$p" 2>/dev/null || true)
			fi
			vers+=("${v%%-*}")
			if grep -q -- "$p" <<<"$held"; then pass "package $p held"; else fail "package $p is not held: an upgrade could move it away from the other"; fi
		done
		if [ "${vers[0]}" = "$NVIDIA_DRIVER_VERSION" ] && [ "${vers[1]}" = "$NVIDIA_DRIVER_VERSION" ]; then
			pass "NVIDIA driver and Fabric Manager packages both at $NVIDIA_DRIVER_VERSION"
		else
			fail "NVIDIA driver package ${pkgs[0]} is '${vers[0]:-none}' and Fabric Manager ${pkgs[1]} '${vers[1]:-none}': both must be $NVIDIA_DRIVER_VERSION"
		fi
		;;
	esac
	if ! compgen -G "/proc/driver/nvidia/gpus/*" >/dev/null; then
		not_checked "nvidia devices, Fabric Manager version and DCGM: no GPU on this builder"
	else
		if [ -e /dev/nvidia0 ] && [ -e /dev/nvidiactl ]; then pass "nvidia device nodes present"; else fail "nvidia: /dev/nvidia0 or /dev/nvidiactl missing"; fi
		driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)
		fm=$(nv-fabricmanager --version 2>/dev/null | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n1 || true)
		if [ -n "$driver" ] && [ "$driver" = "$fm" ]; then
			pass "Fabric Manager $fm matches the driver"
		else
			fail "Fabric Manager version '${fm:-none}' differs from the driver's '${driver:-none}'"
		fi
		if [ "${NVIDIA_DCGM:-false}" = true ]; then
			if dcgmi discovery -l >/dev/null 2>&1; then pass "dcgm: dcgmi discovery -l"; else fail "dcgm: dcgmi discovery -l failed"; fi
		fi
	fi
fi

# Units enabled.
units=(slurm-node-agent-bootstrap.service slurm-node-agent.service slurmd.service)
[ "${SLURM_AUTH:-munge}" != slurm ] && units+=(munge.service)
for u in "${units[@]}"; do
	if reason=$(skipped_reason "agent: unit $u"); then
		not_checked "unit $u ($reason)"
		continue
	fi
	state=$(systemctl is-enabled "$u" 2>/dev/null || true)
	if [ "$state" = enabled ]; then pass "unit $u enabled"; else fail "unit $u is '${state:-unknown}', expected enabled"; fi
done

# Nothing from the cleanup list left.
if [ "${ACCEPTANCE_CLEANUP_CHECK:-true}" = true ]; then
	left=()
	for f in /etc/ssh/ssh_host_* /etc/munge/munge.key /etc/slurm/slurm.key /root/.bash_history /home/*/.bash_history \
		/var/lib/cloud/instances /var/lib/cloud/instance /var/lib/systemd/random-seed; do
		[ -e "$f" ] || [ -L "$f" ] && left+=("$f")
	done
	[ ! -s /etc/machine-id ] || left+=("/etc/machine-id (not empty)")
	while IFS= read -r f; do left+=("$f (log not empty)"); done < <(find /var/log -type f -size +0c 2>/dev/null)
	if [ -n "$(find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name lock ! -name partial 2>/dev/null)" ]; then
		left+=("/var/lib/apt/lists (package indexes)")
	fi
	if [ ${#left[@]} -eq 0 ]; then pass "cleanup: nothing left"; else fail "cleanup: left behind: ${left[*]}"; fi
else
	not_checked "cleanup (ACCEPTANCE_CLEANUP_CHECK=false)"
fi

if [ -s "$SKIPPED_FILE" ]; then
	log "parts skipped at build:"
	sed 's/^/    /' "$SKIPPED_FILE"
fi
if [ "$failures" -gt 0 ]; then
	die "$failures acceptance check(s) failed: see FAIL lines above"
fi
if [ "$unchecked" -gt 0 ]; then
	log "all acceptance checks passed; $unchecked not checked (see above)"
else
	log "all acceptance checks passed"
fi
