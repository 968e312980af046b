#!/usr/bin/env bash
# 65-services: what operators expect on every node, on every OS family:
#   - amazon-ssm-agent, enabled: SSM Run Command is the node's operator interface;
#   - chrony on the Amazon Time Sync Service (169.254.169.123, and fd00:ec2::123 over IPv6
#     on Nitro instances): munge refuses credentials when clocks drift;
#   - optionally (CLOUDWATCH_AGENT=true) the CloudWatch agent, shipping the journal of
#     slurmd and slurm-node-agent (exported to a file it can follow).
# amazon-ssm-agent (outside Ubuntu's snap and Amazon Linux's repository) and the CloudWatch
# agent come from AWS's download buckets, not from a distribution.
set -Eeuo pipefail
STEP=65-services
for lib in "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "${IMAGE_STAGING:-/tmp/slurm-image}/scripts/lib.sh" /usr/local/lib/slurm-image/lib.sh; do
	[ -r "$lib" ] && break
done
# shellcheck source=lib.sh
. "$lib"
require_root

region=${IMAGE_REGION:-us-east-1}
case ${IMAGE_ARCH:-x86_64} in
x86_64) parch=amd64 ;;
arm64) parch=arm64 ;;
*) die "unknown architecture '${IMAGE_ARCH}'" ;;
esac
CACHE=/var/cache/slurm-image
UNIT_DIR=/etc/systemd/system

pkg_present() { [ -z "$(pkg_missing "$1")" ]; }

# fetch_unpinned NAME URL DEST: AWS publishes these agents as "latest" without a checksum
# list; they are signed packages, installed by the package manager. 2 when unreachable.
fetch_unpinned() {
	mkdir -p "$(dirname "$3")"
	probe "$2" || return 2
	log "$1: downloading $2"
	curl -fsSL --retry 2 --connect-timeout 10 -o "$3" "$2" || return 2
}

# --- amazon-ssm-agent ---------------------------------------------------------------
NAME="amazon-ssm-agent"
ssm_unit=amazon-ssm-agent.service
ssm_ok=true
if [ "$(os_family)" = deb ]; then
	if command -v snap >/dev/null 2>&1 && [ "${IMAGE_OS#ubuntu-}" != "${IMAGE_OS:-}" ]; then
		# Ubuntu's AMIs carry the agent as a snap; install it where it is missing.
		snap list amazon-ssm-agent >/dev/null 2>&1 ||
			pkg_run "snap install amazon-ssm-agent" snap install amazon-ssm-agent --classic
		ssm_unit=snap.amazon-ssm-agent.amazon-ssm-agent.service
	elif ! pkg_present amazon-ssm-agent; then
		url=https://s3.$region.amazonaws.com/amazon-ssm-$region/latest/debian_$parch/amazon-ssm-agent.deb
		rc=0
		fetch_unpinned "$NAME" "$url" "$CACHE/amazon-ssm-agent.deb" || rc=$?
		if [ "$rc" -eq 0 ]; then
			pkg_run "installing amazon-ssm-agent" dpkg -i "$CACHE/amazon-ssm-agent.deb"
		else
			unreachable "$NAME" "$url"
			ssm_ok=false
		fi
	fi
else
	case ${IMAGE_OS:-} in
	al2023) pkg_install amazon-ssm-agent ;;
	*)
		if ! pkg_present amazon-ssm-agent; then
			url=https://s3.$region.amazonaws.com/amazon-ssm-$region/latest/linux_$parch/amazon-ssm-agent.rpm
			if probe "$url"; then
				pkg_run "installing amazon-ssm-agent" dnf_cmd install -y -q "$url"
			else
				unreachable "$NAME" "$url"
				ssm_ok=false
			fi
		fi
		;;
	esac
fi
if [ "$ssm_ok" = true ]; then
	systemctl enable "$ssm_unit" >/dev/null
	clear_skip "$NAME"
	log "amazon-ssm-agent installed and enabled ($ssm_unit)"
fi

# --- chrony on the Amazon Time Sync Service ------------------------------------------
pkg_install chrony
if [ "$(os_family)" = deb ]; then
	chrony_conf=/etc/chrony/chrony.conf chrony_unit=chrony.service
else
	chrony_conf=/etc/chrony.conf chrony_unit=chronyd.service
fi
mkdir -p "$(dirname "$chrony_conf")"
begin="# BEGIN slurm-image: Amazon Time Sync Service"
end="# END slurm-image"
{
	if [ -f "$chrony_conf" ]; then
		awk -v b="$begin" -v e="$end" '$0 == b {skip = 1} !skip {print} $0 == e {skip = 0}' "$chrony_conf"
	fi
	cat <<CONF
$begin
# Link-local NTP on every EC2 instance (IPv6 address on Nitro instances); preferred over
# the distribution's pools, which stay as a fallback.
server 169.254.169.123 prefer iburst minpoll 4 maxpoll 4
server fd00:ec2::123 prefer iburst minpoll 4 maxpoll 4
$end
CONF
} >"$chrony_conf.slurm-image"
write_if_changed "$chrony_conf" 0644 <"$chrony_conf.slurm-image"
rm -f "$chrony_conf.slurm-image"
systemctl enable "$chrony_unit" >/dev/null
log "chrony uses the Amazon Time Sync Service ($chrony_conf); $chrony_unit enabled"

# --- CloudWatch agent (optional) ---------------------------------------------------------
if [ "${CLOUDWATCH_AGENT:-false}" = true ]; then
	NAME="CloudWatch agent"
	cw_ok=true
	if ! pkg_present amazon-cloudwatch-agent; then
		if [ "${IMAGE_OS:-}" = al2023 ]; then
			pkg_install amazon-cloudwatch-agent
		else
			case ${IMAGE_OS:-} in
			ubuntu-*) dir=ubuntu ext=deb ;;
			debian-*) dir=debian ext=deb ;;
			*) dir=redhat ext=rpm ;;
			esac
			url=https://amazoncloudwatch-agent.s3.amazonaws.com/$dir/$parch/latest/amazon-cloudwatch-agent.$ext
			rc=0
			fetch_unpinned "$NAME" "$url" "$CACHE/amazon-cloudwatch-agent.$ext" || rc=$?
			if [ "$rc" -ne 0 ]; then
				unreachable "$NAME" "$url"
				cw_ok=false
			elif [ "$ext" = deb ]; then
				pkg_run "installing the CloudWatch agent" dpkg -i "$CACHE/amazon-cloudwatch-agent.deb"
			else
				pkg_run "installing the CloudWatch agent" dnf_cmd install -y -q "$CACHE/amazon-cloudwatch-agent.rpm"
			fi
		fi
	fi
	if [ "$cw_ok" = true ]; then
		# The agent follows files, not the journal: a small unit exports the journal of
		# the node's Slurm units to one file (a cursor file keeps restarts from repeating).
		write_if_changed "$UNIT_DIR/slurm-image-journal-export.service" 0644 <<'UNIT'
[Unit]
Description=Export the journal of slurmd and slurm-node-agent for the CloudWatch agent
After=systemd-journald.service

[Service]
ExecStartPre=/usr/bin/mkdir -p /var/log/slurm-node /var/lib/slurm-image
ExecStart=/usr/bin/journalctl --follow --output=short-iso --cursor-file=/var/lib/slurm-image/journal-export.cursor --unit=slurmd.service --unit=slurm-node-agent.service --unit=slurm-node-agent-bootstrap.service
StandardOutput=append:/var/log/slurm-node/journal.log
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
		write_if_changed /opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json 0644 <<'JSON'
{
  "agent": { "run_as_user": "root" },
  "logs": {
    "logs_collected": {
      "files": {
        "collect_list": [
          {
            "file_path": "/var/log/slurm-node/journal.log",
            "log_group_name": "/slurm/nodes/journal",
            "log_stream_name": "{instance_id}",
            "timezone": "UTC"
          }
        ]
      }
    }
  }
}
JSON
		systemctl enable slurm-image-journal-export.service amazon-cloudwatch-agent.service >/dev/null
		clear_skip "$NAME"
		log "CloudWatch agent installed; ships the Slurm units' journal to /slurm/nodes/journal"
	fi
fi
log "done"
