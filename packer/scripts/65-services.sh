#!/usr/bin/env bash
# 65-services: what operators expect on every node, on every OS family:
#   - amazon-ssm-agent, enabled: SSM Run Command is the node's operator interface;
#   - chrony on the Amazon Time Sync Service (169.254.169.123, and fd00:ec2::123 over IPv6
#     on Nitro instances): munge refuses credentials when clocks drift;
#   - optionally (CLOUDWATCH_AGENT=true) the CloudWatch agent, shipping the journal of
#     slurm-node-agent, slurmd and sackd, the kernel's log and cloud-init's (read by the
#     CloudWatch agent from the journal and the files themselves; its configuration is
#     rendered at boot by slurm-node-agent-cloudwatch-config.service), and the agent's
#     Prometheus textfile metrics (health checks and drains). The CloudWatch agent scrapes
#     Prometheus endpoints, not files, so the distribution's node exporter serves the
#     textfile folder on 127.0.0.1:9100 with only its textfile collector.
# amazon-ssm-agent (outside Ubuntu's snap and Amazon Linux's repository) and the CloudWatch
# agent come from AWS's download buckets, not from a distribution: "latest" packages with no
# checksum list, so each is checked against its detached signature (.sig) by the signing
# key pinned in packer/files/keys/ (fetch_signed in lib.sh) before it is installed.
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
		fetch_signed "$NAME" "$url" "$CACHE/amazon-ssm-agent.deb" amazon-ssm-agent || rc=$?
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
			rc=0
			fetch_signed "$NAME" "$url" "$CACHE/amazon-ssm-agent.rpm" amazon-ssm-agent || rc=$?
			if [ "$rc" -eq 0 ]; then
				pkg_run "installing amazon-ssm-agent" dnf_cmd install -y -q "$CACHE/amazon-ssm-agent.rpm"
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

# --- the agent's Prometheus textfile metrics, for the CloudWatch agent -------------------
METRICS_DIR=/var/lib/slurm-node-agent/metrics
AGENT_CONF_D=/etc/slurm-node-agent/conf.d

# setup_textfile_metrics: the node exporter (textfile collector only, loopback only), the
# agent's settings that write its textfiles into METRICS_DIR (an image-level drop-in: these
# keys are image-only), and the CloudWatch agent's scrape configuration. Sets
# exporter_unit. 1 (recorded as skipped) where the OS has no node exporter package.
setup_textfile_metrics() {
	local pkg bin
	case ${IMAGE_OS:-} in
	debian-* | ubuntu-*) pkg=prometheus-node-exporter bin=/usr/bin/prometheus-node-exporter exporter_unit=prometheus-node-exporter.service ;;
	rocky*)
		pkg_install epel-release
		pkg=golang-github-prometheus-node-exporter bin=/usr/bin/node_exporter exporter_unit=node_exporter.service
		;;
	*)
		record_skip "Prometheus textfile metrics" "${IMAGE_OS:-this OS} has no node exporter package; the CloudWatch agent ships logs only"
		log "skipped: ${IMAGE_OS:-this OS} has no node exporter package, so the textfile metrics are not shipped (logs are)"
		return 1
		;;
	esac
	pkg_install "$pkg"
	install -d -m 0755 "$METRICS_DIR" "$AGENT_CONF_D" "$UNIT_DIR/$exporter_unit.d"
	write_if_changed "$UNIT_DIR/$exporter_unit.d/slurm-image.conf" 0644 <<UNIT
# slurm-image: serve only the agent's textfile metrics, only on loopback, for the
# CloudWatch agent (its Prometheus scrape configuration names 127.0.0.1:9100).
[Service]
EnvironmentFile=
ExecStart=
ExecStart=$bin --web.listen-address=127.0.0.1:9100 --collector.disable-defaults --collector.textfile --collector.textfile.directory=$METRICS_DIR
UNIT
	write_if_changed "$AGENT_CONF_D/60-textfile-metrics.toml" 0644 <<TOML
# slurm-image: the agent's Prometheus textfiles, served by $exporter_unit and shipped by
# the CloudWatch agent (image build option cloudwatch_agent).
[health]
prometheus_textfile = "$METRICS_DIR/health.prom"

[drain]
metrics_file = "$METRICS_DIR/drain.prom"
TOML
	write_if_changed /opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml 0644 <<'YAML'
# slurm-image: scrape the agent's textfile metrics (served by the node exporter).
global:
  scrape_interval: 1m
  scrape_timeout: 10s
scrape_configs:
  - job_name: slurm-node-agent
    sample_limit: 10000
    static_configs:
      - targets: ["127.0.0.1:9100"]
YAML
	return 0
}

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
			fetch_signed "$NAME" "$url" "$CACHE/amazon-cloudwatch-agent.$ext" amazon-cloudwatch-agent || rc=$?
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
		# The CloudWatch agent reads the journal itself (logs_collected.journald): no
		# export file to grow. Its configuration is rendered at each boot by
		# slurm-node-agent-cloudwatch-config.service (before the CloudWatch agent starts)
		# from the settings: log groups named after the cluster, the site's retention,
		# native nvidia_smi and efa metrics where the instance has the devices.
		CW_ETC=/opt/aws/amazon-cloudwatch-agent/etc
		install -d -m 0755 "$AGENT_CONF_D" "$CW_ETC"
		# An image built before this one exported the journal to a file: gone.
		if [ -e "$UNIT_DIR/slurm-image-journal-export.service" ]; then
			systemctl disable slurm-image-journal-export.service >/dev/null 2>&1 || true
			rm -f "$UNIT_DIR/slurm-image-journal-export.service" /var/log/slurm-node/journal.log
		fi
		# The unit that renders it (slurm-node-agent-cloudwatch-config.service) is the
		# agent's: 70-agent.sh installs (or takes from the agent's package) and enables it
		# wherever the drop-in below is.
		cw_units=(amazon-cloudwatch-agent.service)
		prometheus_config=""
		if setup_textfile_metrics; then
			cw_units+=("$exporter_unit")
			prometheus_config=$CW_ETC/prometheus.yaml
			log "CloudWatch agent: the agent's textfile metrics ($METRICS_DIR) are scraped through $exporter_unit"
		fi
		write_if_changed "$AGENT_CONF_D/55-cloudwatch.toml" 0644 <<TOML
# slurm-image: where slurm-node-agent-cloudwatch-config.service writes the CloudWatch
# agent's configuration at boot (image-only keys). The log groups' names and retention are
# the launch's: cloudwatch.log_group_template, cloudwatch.cluster_name and
# cloudwatch.retention_days in user data (docs/operator-guide.md, "Logs and metrics").
[cloudwatch]
config_file = "$CW_ETC/amazon-cloudwatch-agent.json"
prometheus_config = "$prometheus_config"
TOML
		# journald's own files are the logs' store on the node: persistent, capped.
		install -d -m 0755 /etc/systemd/journald.conf.d
		write_if_changed /etc/systemd/journald.conf.d/slurm-image.conf 0644 <<'CONF'
# slurm-image: the journal is where the node's logs live (the CloudWatch agent reads it):
# kept across reboots, capped so that it never fills the root file system.
[Journal]
Storage=persistent
SystemMaxUse=1G
SystemKeepFree=2G
CONF
		# cloud-init's logs are files: rotated by size where the OS ships no rule for them.
		if ! grep -qs 'cloud-init' /etc/logrotate.d/* 2>/dev/null; then
			pkg_present logrotate || pkg_install logrotate
			install -d -m 0755 /etc/logrotate.d
			write_if_changed /etc/logrotate.d/slurm-image-cloud-init 0644 <"${IMAGE_STAGING:-/tmp/slurm-image}/files/logrotate/slurm-image-cloud-init"
		fi
		systemctl enable "${cw_units[@]}" >/dev/null
		clear_skip "$NAME"
		log "CloudWatch agent installed; its configuration is rendered at boot by slurm-node-agent-cloudwatch-config.service (70-agent)"
	fi
fi
log "done"
