#!/usr/bin/env bash
# Builds the .deb and .rpm of slurm-node-agent (both programs, units and drop-ins,
# tmpfiles.d, SSM documents, settings, man pages and completions; agent/Cargo.toml's
# [package.metadata.deb] and [package.metadata.generate-rpm]) into target/packages/, with
# cargo-deb and cargo-generate-rpm (scripts/test-deps.sh installs them).
#
#   scripts/package.sh [--profile release|dev] [--no-build] [--fast] [--version VERSION] [--out DIR]
#
#   --profile   the Cargo profile packaged (default release; the tests package the debug
#               build the suite has already made, `--profile dev --no-build`)
#   --no-build  package the binaries as they are in target/<profile>/
#   --fast      quicker, larger compression: the tests' packages
#   --version   the packages' version instead of the workspace's (the upgrade test's)
#   --out       where the packages go (default target/packages)
#
# Prints the two packages' paths, one a line, .deb first.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
build=1
fast=0
version=
out=target/packages
while [ $# -gt 0 ]; do
	case $1 in
	--profile) profile=${2:?--profile needs a value}; shift 2 ;;
	--no-build) build=0; shift ;;
	--fast) fast=1; shift ;;
	--version) version=${2:?--version needs a value}; shift 2 ;;
	--out) out=${2:?--out needs a value}; shift 2 ;;
	*) echo "package.sh: unknown argument '$1'" >&2; exit 2 ;;
	esac
done
case $version in
'' | [0-9]*) ;;
*) echo "package.sh: --version '$version' must start with a digit" >&2; exit 2 ;;
esac
for tool in cargo-deb cargo-generate-rpm; do
	command -v "$tool" >/dev/null ||
		{ echo "package.sh: $tool not found (scripts/test-deps.sh installs it)" >&2; exit 1; }
done
# The target folder and the agent's version, as Cargo has them.
read -r target_dir workspace_version < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
m = json.load(sys.stdin)
v = next(p["version"] for p in m["packages"] if p["name"] == "slurm-node-agent")
print(m["target_directory"], v)')
dir=$profile
[ "$profile" = dev ] && dir=debug
bin=$target_dir/$dir

if [ "$build" = 1 ]; then
	cargo build --locked --profile "$profile" -p slurm-node-agent --bins
fi
for b in slurm-node-agent slurm-node-agent-healthcheck; do
	[ -x "$bin/$b" ] || { echo "package.sh: $bin/$b not built" >&2; exit 1; }
done
# Man pages and completions from the binary's own command line (cli/manual.rs), where the
# metadata's target/release/share/... paths point for this profile; man pages gzipped, as
# man-db and both distributions' policies expect.
rm -rf "$bin/share"
"$bin/slurm-node-agent" generate --out "$bin/share" >/dev/null
gzip -9n "$bin"/share/man/man1/*.1

mkdir -p "$out"
deb_args=(-p slurm-node-agent --no-build --profile "$profile" --output "$out" --quiet)
rpm=$out/slurm-node-agent-${version:-$workspace_version}-1.$(uname -m).rpm
rpm_args=(-p agent --profile "$profile" --target-dir "$target_dir" --output "$rpm")
if [ -n "$version" ]; then
	deb_args+=(--deb-version "$version-1")
	rpm_args+=(--set-metadata "version = \"$version\"")
fi
# The debug build keeps its line tables (no strip, no separate symbols package).
[ "$profile" = release ] || deb_args+=(--no-strip --no-dbgsym)
if [ "$fast" = 1 ]; then
	deb_args+=(--fast)
	rpm_args+=(--payload-compress gzip)
fi
deb=$(cargo deb "${deb_args[@]}")
rpm_log=$(cargo generate-rpm "${rpm_args[@]}" 2>&1) || { echo "$rpm_log" >&2; exit 1; }
echo "$deb"
echo "$rpm"
