#!/usr/bin/env bash
# 70-agent: slurm-node-agent, its man pages and shell completions, its systemd units, the
# slurmd drop-in, tmpfiles, default settings and default health checks, from
# $IMAGE_STAGING/agent (the agent build) and $IMAGE_STAGING/files.
# Expected layout of $IMAGE_STAGING/agent:
#   slurm-node-agent                                 the binary
#   slurm-node-agent-healthcheck                     HealthCheckProgram (same build)
#   units/slurm-node-agent-bootstrap.service         units/slurm-node-agent.service
#   units/slurmd.service.d/slurm-node-agent.conf     units/tmpfiles.d/slurm-node-agent.conf
#   units/munge.service.d/slurm-node-agent.conf      units/sackd.service.d/slurm-node-agent.conf
set -Eeuo pipefail
STEP=70-agent
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

AGENT_SRC=$IMAGE_STAGING/agent
UNIT_DIR=/etc/systemd/system
missing=()

# absent WHAT PATH: a part of the agent build is not there. Said plainly; fatal unless
# ALLOW_SKIPS=true (local test builds while the agent is being written).
absent() {
	if [ "$ALLOW_SKIPS" = true ]; then
		record_skip "agent: $1" "absent from the agent build ($2)"
		log "absent: $1 not found at $2; the image will lack it"
		missing+=("$1")
	else
		die "$1 not found at $2: build the agent (cargo build --release -p slurm-node-agent) and pass agent_dir"
	fi
}

# place SRC DEST MODE: install a file when it differs.
place() { write_if_changed "$2" "$3" <"$1"; }

# The agent as a package (slurm-image-builder --agent-package: slurm-node-agent.deb or
# .rpm, already checked against this OS and architecture): installed by the OS's package
# manager with its programs, units, drop-ins, tmpfiles.d, man pages and completions; the
# rest of this step then adds what only an image knows and enables the units.
package=
for f in "$AGENT_SRC/slurm-node-agent.deb" "$AGENT_SRC/slurm-node-agent.rpm"; do
	[ -f "$f" ] && package=$f
done
if [ -n "$package" ]; then
	family=$(os_family)
	[ "${package##*.}" = "$family" ] || die "$package: a .${package##*.} package, but this OS installs .$family packages"
	if [ "$family" = deb ]; then
		pkg_run "installing $package" apt_get install -y -qq --no-install-recommends "$package"
	else
		pkg_run "installing $package" dnf_cmd install -y -q "$package"
	fi
	log "installed $(basename "$package") ($(/usr/bin/slurm-node-agent --version 2>/dev/null || echo 'version unknown'))"
fi

# Both programs in /usr/bin, where the .deb and .rpm put them and the units run them from;
# /usr/local/bin/<program> links to each, for what names the path of images built before
# (a controller's HealthCheckProgram=, SSM documents, site scripts).
for prog in slurm-node-agent slurm-node-agent-healthcheck; do
	if [ -n "$package" ]; then
		[ -x "/usr/bin/$prog" ] || die "$package installed no /usr/bin/$prog"
	fi
	if [ -n "$package" ] || [ -f "$AGENT_SRC/$prog" ]; then
		[ -n "$package" ] || place "$AGENT_SRC/$prog" "/usr/bin/$prog" 0755
		install -d -m 0755 /usr/local/bin
		if [ "$(readlink "/usr/local/bin/$prog" 2>/dev/null)" != "/usr/bin/$prog" ]; then
			ln -sfn "/usr/bin/$prog" "/usr/local/bin/$prog"
			log "/usr/local/bin/$prog -> /usr/bin/$prog"
		fi
		clear_skip "agent: $prog binary"
	else
		absent "$prog binary" "$AGENT_SRC/$prog"
	fi
done

# Man pages and bash, zsh and fish completions of both programs, written by the agent
# itself (`generate`: from its own command line, so they match the binary) under
# /usr/local/share (files no package owns): man-db, bash-completion, zsh and fish look there.
SHARE_DIR=${AGENT_SHARE_DIR:-/usr/local/share}
if [ -n "$package" ]; then
	clear_skip "agent: man pages and completions"
elif [ -x /usr/bin/slurm-node-agent ]; then
	generated=$(mktemp -d)
	if /usr/bin/slurm-node-agent generate --out "$generated" >/dev/null; then
		while IFS= read -r f; do
			place "$generated/$f" "$SHARE_DIR/$f" 0644
		done < <(cd "$generated" && find . -type f -printf '%P\n' | sort)
		clear_skip "agent: man pages and completions"
	elif [ "$ALLOW_SKIPS" = true ]; then
		record_skip "agent: man pages and completions" "slurm-node-agent generate failed"
		log "absent: man pages and completions (slurm-node-agent generate failed)"
		missing+=("man pages and completions")
	else
		rm -rf "$generated"
		die "slurm-node-agent generate --out $generated failed: the man pages and completions were not written"
	fi
	rm -rf "$generated"
fi

units=(slurm-node-agent-bootstrap.service slurm-node-agent.service)
# With the CloudWatch agent (65-services wrote its settings drop-in): the unit that renders
# its configuration at boot.
[ -f /etc/slurm-node-agent/conf.d/55-cloudwatch.toml ] && units+=(slurm-node-agent-cloudwatch-config.service)
# With a package, the units, drop-ins and tmpfiles.d are the package's (in /usr/lib, where
# an upgrade of the package updates them); none is copied to /etc, which would shadow them.
for u in "${units[@]}"; do
	if [ -n "$package" ]; then
		[ -f "/usr/lib/systemd/system/$u" ] || die "$package installed no /usr/lib/systemd/system/$u"
	elif [ -f "$AGENT_SRC/units/$u" ]; then
		place "$AGENT_SRC/units/$u" "$UNIT_DIR/$u" 0644
		clear_skip "agent: unit $u"
	else
		absent "unit $u" "$AGENT_SRC/units/$u"
	fi
done

if [ -n "$package" ]; then
	: # the package's
elif [ -f "$AGENT_SRC/units/slurmd.service.d/slurm-node-agent.conf" ]; then
	place "$AGENT_SRC/units/slurmd.service.d/slurm-node-agent.conf" "$UNIT_DIR/slurmd.service.d/slurm-node-agent.conf" 0644
	clear_skip "agent: slurmd drop-in"
else
	absent "slurmd drop-in" "$AGENT_SRC/units/slurmd.service.d/slurm-node-agent.conf"
fi

# sackd's drop-in (login nodes, node.role = "login"): sackd stays disabled; bootstrap
# starts it on a login node with the options it writes. Only where the image has a sackd
# (Slurm 23.11+): on an older Slurm a login role stops at bootstrap, naming node.role.
if [ -n "$package" ]; then
	: # the package's
elif [ -f "$AGENT_SRC/units/sackd.service.d/slurm-node-agent.conf" ]; then
	place "$AGENT_SRC/units/sackd.service.d/slurm-node-agent.conf" "$UNIT_DIR/sackd.service.d/slurm-node-agent.conf" 0644
	clear_skip "agent: sackd drop-in"
else
	absent "sackd drop-in" "$AGENT_SRC/units/sackd.service.d/slurm-node-agent.conf"
fi
if [ -n "$(systemctl list-unit-files sackd.service --no-legend 2>/dev/null)" ] ||
	[ -f /usr/lib/systemd/system/sackd.service ] || [ -f /lib/systemd/system/sackd.service ]; then
	# Off unless the role asks for it: bootstrap starts it on a login node.
	systemctl disable sackd.service >/dev/null 2>&1 || true
	log "sackd.service present (disabled: started by bootstrap on login nodes)"
else
	log "no sackd.service in this image: it cannot make login nodes (node.role = \"login\")"
fi

# The auth plugins this image can join with: SLURM_AUTH is the builder's --auth (munge,
# slurm, or munge+slurm: MUNGE installed and Slurm with both plugins). munge+slurm is
# narrowed here to what the Slurm installed really has (auth_slurm.so needs 23.11 and
# libjwt).
SLURM_AUTH=${SLURM_AUTH:-munge}
case $SLURM_AUTH in
munge | slurm | munge+slurm) ;;
*) die "SLURM_AUTH must be munge, slurm or munge+slurm, not '$SLURM_AUTH'" ;;
esac
auth_plugin_dir=
for d in /opt/slurm/lib/slurm /usr/lib64/slurm /usr/lib/*-linux-*/slurm-wlm /usr/lib/slurm; do
	if compgen -G "$d/auth_*.so" >/dev/null; then
		auth_plugin_dir=$d
		break
	fi
done
image_auth=$SLURM_AUTH
if [ "$SLURM_AUTH" = munge+slurm ] && [ -n "$auth_plugin_dir" ] && [ ! -f "$auth_plugin_dir/auth_slurm.so" ]; then
	log "Slurm's plugins ($auth_plugin_dir) have no auth_slurm.so: this image joins with munge only (auth.type = \"munge\")"
	image_auth=munge
fi

# munge's drop-in: no start (and no failed unit) at boot before bootstrap wrote the key.
if [ "$SLURM_AUTH" != slurm ]; then
	if [ -n "$package" ]; then
		: # the package's
	elif [ -f "$AGENT_SRC/units/munge.service.d/slurm-node-agent.conf" ]; then
		place "$AGENT_SRC/units/munge.service.d/slurm-node-agent.conf" "$UNIT_DIR/munge.service.d/slurm-node-agent.conf" 0644
		clear_skip "agent: munge drop-in"
	else
		absent "munge drop-in" "$AGENT_SRC/units/munge.service.d/slurm-node-agent.conf"
	fi
fi

if [ -n "$package" ]; then
	: # the package's
elif [ -f "$AGENT_SRC/units/tmpfiles.d/slurm-node-agent.conf" ]; then
	place "$AGENT_SRC/units/tmpfiles.d/slurm-node-agent.conf" /etc/tmpfiles.d/slurm-node-agent.conf 0644
	clear_skip "agent: tmpfiles"
else
	absent "tmpfiles" "$AGENT_SRC/units/tmpfiles.d/slurm-node-agent.conf"
fi

settings=$AGENT_SRC/agent.toml
[ -f "$settings" ] || settings=$IMAGE_STAGING/files/agent.toml
if [ -f "$settings" ]; then
	place "$settings" /etc/slurm-node-agent/agent.toml 0644
	clear_skip "agent: settings"
else
	absent "settings" "$IMAGE_STAGING/files/agent.toml"
fi

# What this image knows better than the defaults: the auth plugin when it can do only one
# (else the join picks: auth/slurm for the managed service, munge for a controller of the
# site's), and where Slurm lives.
bin_dir=/usr/bin
[ -x /opt/slurm/bin/scontrol ] && bin_dir=/opt/slurm/bin
case $image_auth in
munge+slurm)
	auth_toml="# auth.type not set: this image has MUNGE and Slurm's auth/munge and auth/slurm, so
# the join decides (auth/slurm in the managed join, pcs.enabled; munge otherwise)."
	;;
*)
	auth_toml="[auth]
type = \"$image_auth\""
	;;
esac
write_if_changed /etc/slurm-node-agent/conf.d/10-image.toml 0644 <<TOML
# Written by packer/scripts/70-agent.sh for this image; later drop-ins override it.
$auth_toml

[slurm]
bin_dir = "$bin_dir"
TOML
log "auth: ${image_auth} (conf.d/10-image.toml)"
# Node-local scratch is btrfs over the instance store disks: an image without mkfs.btrfs
# (RHEL 9, Amazon Linux 2023) leaves the disks alone rather than drain every node that has
# some.
if command -v mkfs.btrfs >/dev/null 2>&1; then
	rm -f /etc/slurm-node-agent/conf.d/11-scratch.toml
else
	log "mkfs.btrfs not in this image: node-local scratch turned off (scratch.enabled = false)"
	write_if_changed /etc/slurm-node-agent/conf.d/11-scratch.toml 0644 <<'TOML'
# Written by packer/scripts/70-agent.sh: this image has no mkfs.btrfs (btrfs-progs).
[scratch]
enabled = false
TOML
fi
install -d -m 0755 /var/lib/slurm-node-agent
# The health checks' folder (health.checks_dir) with the image's default checks; a site
# adds its own *.toml there, and a check of the same name in a later file replaces the
# default one (docs/health-checks.md).
install -d -m 0755 /etc/slurm-node-agent/checks.d
if [ -f "$IMAGE_STAGING/files/checks.d/10-defaults.toml" ]; then
	place "$IMAGE_STAGING/files/checks.d/10-defaults.toml" /etc/slurm-node-agent/checks.d/10-defaults.toml 0644
	clear_skip "agent: default health checks"
else
	absent "default health checks" "$IMAGE_STAGING/files/checks.d/10-defaults.toml"
fi

# Enable the units (works offline: systemctl only writes the links in a chroot).
to_enable=()
for u in "${units[@]}"; do
	{ [ -f "$UNIT_DIR/$u" ] || [ -f "/usr/lib/systemd/system/$u" ]; } && to_enable+=("$u")
done
for u in slurmd.service munge.service; do
	[ "$u" = munge.service ] && [ "$SLURM_AUTH" = slurm ] && continue
	to_enable+=("$u")
done
for u in "${to_enable[@]}"; do
	if [ "$(systemctl is-enabled "$u" 2>/dev/null || true)" != enabled ]; then
		systemctl enable "$u" 2>&1 | grep -v '^Created symlink' || true
		[ "$(systemctl is-enabled "$u" 2>/dev/null || true)" = enabled ] ||
			die "could not enable $u: check its [Install] section"
	fi
done
log "enabled: ${to_enable[*]}"
if [ ${#missing[@]} -gt 0 ]; then
	log "done, WITHOUT: ${missing[*]}"
else
	log "done"
fi
