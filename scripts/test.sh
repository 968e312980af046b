#!/usr/bin/env bash
# Runs the whole test suite on Debian 12 as root: installs what the tests need (munge,
# systemd, packer, mmdebstrap, Slurm's build dependencies...; moto from PyPI), puts the
# Slurm version under test in place (SchedMD's pinned tarball, built once per checksum by
# scripts/slurm-build.sh and reused by the fleet's node image), builds every binary (the
# end-to-end tests run the real ones), then `cargo test` over the workspace.
#
#   sudo scripts/test.sh [extra cargo test arguments]
#
# Environment:
#   SLURM_E2E_VERSION  the Slurm the suite runs against (default 25.11: what AWS PCS and
#                      ParallelCluster 3.15+ ship); 24.11, 25.11 or 22.05 (Debian 12's
#                      own packages). scripts/test-matrix.sh runs several.
#   SLURM_SOURCES_DIR  SchedMD's release tarballs (default ../shared/sources)
#   SLURM_E2E_FLEET_MATRIX
#                      after the whole suite, the fleet matrix: the core fleet scenarios
#                      (boot and join, a job across nodes, a drain and its lift, the
#                      HealthCheckProgram, a login node on auth/slurm, a job's own reboot
#                      (`sbatch --reboot`), a mount unit rewritten and systemd reloaded
#                      under a running job, the rolling upgrade and repairs within their
#                      budget) once per version listed (default "24.11 26.05";
#                      empty: none). Runs only when no cargo test arguments are given.
#                      scripts/test-matrix.sh runs every scenario on every version.
#   SLURM_E2E_MATRIX_NODES  nodes booted at once in the matrix's first scenario, and the
#                      rolling upgrade's nodes there (default 4)
#                      Before the matrix, the version-skew tests: a node on the matrix's
#                      newest release (when newer than the suite's) against the suite's
#                      controller (bootstrap exits 76 before slurmd starts), and an image
#                      with the oldest, the suite's and the newest release (slurmd starts
#                      with the suite's); then a fleet of nodes from an image with the
#                      suite's and the newest release joining on the suite's, whose
#                      controller is upgraded to the newest under running jobs (a node's
#                      slurmd of the suite's release restarted, another rebooted by the
#                      agent through Slurm, while jobs run: issue 41 §2.4), and whose
#                      replacement nodes join on the newest (issue 23 §2).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
export CHECKPOINT_DISABLE=1
SLURM_E2E_VERSION=${SLURM_E2E_VERSION:-25.11}
SLURM_E2E_PREFIX=$(scripts/slurm-build.sh "$SLURM_E2E_VERSION" | tail -n1)
export SLURM_E2E_VERSION SLURM_E2E_PREFIX
export PATH="$SLURM_E2E_PREFIX/sbin:$SLURM_E2E_PREFIX/bin:$PATH"
echo "test.sh: Slurm $("$SLURM_E2E_PREFIX/sbin/slurmd" -V | awk '{print $2}') from $SLURM_E2E_PREFIX" >&2
cargo build --workspace --bins --locked

# The fleet matrix (below) needs a build of each of its versions: compiled into the build
# cache while the suite runs (its tests wait on daemons far more than they compute), so
# the matrix only swaps prefixes. Nothing is installed by these builds.
SLURM_E2E_FLEET_MATRIX=${SLURM_E2E_FLEET_MATRIX-24.11 26.05}
matrix_build=
if [ $# -eq 0 ] && [ -n "$SLURM_E2E_FLEET_MATRIX" ]; then
	mkdir -p target/slurm-matrix
	(
		for v in $SLURM_E2E_FLEET_MATRIX; do
			scripts/slurm-build.sh --cache-only "$v" || exit 1
		done
	) >target/slurm-matrix/build.log 2>&1 &
	matrix_build=$!
fi
cargo test --workspace --locked "$@"

# The fleet matrix: the same core scenarios against each other release users run, each
# on its own pinned build (host, controller and node image), then the suite's version back.
if [ $# -eq 0 ] && [ -n "$SLURM_E2E_FLEET_MATRIX" ]; then
	if ! wait "$matrix_build"; then
		tail -n 40 target/slurm-matrix/build.log >&2
		echo "test.sh: building Slurm for the fleet matrix failed (target/slurm-matrix/build.log)" >&2
		exit 1
	fi
	suite_version=$SLURM_E2E_VERSION
	# Version skew (issue 23): a node whose Slurm is newer than the suite's controller (the
	# matrix's newest release, when newer than the suite's), and an image with three
	# releases (the matrix's oldest, the suite's, the newest) choosing the suite's.
	newest=$(tr ' ' '\n' <<<"$SLURM_E2E_FLEET_MATRIX" | sed '/^$/d' | sort -V | tail -n1)
	oldest=$(tr ' ' '\n' <<<"$SLURM_E2E_FLEET_MATRIX" | sed '/^$/d' | sort -V | head -n1)
	# A release newer than the suite's (MAJOR.MINOR), against a controller of 25.11 or later:
	# the one that answers a newer client with words bootstrap can tell from a wrong key.
	suite_release=$(cut -d. -f1,2 <<<"$SLURM_E2E_VERSION")
	newest=$(cut -d. -f1,2 <<<"$newest")
	oldest=$(cut -d. -f1,2 <<<"$oldest")
	if [ "$(printf '%s\n' "$newest" "$suite_release" | sort -V | tail -n1)" != "$suite_release" ] &&
		[ "$(printf '%s\n' 25.11 "$suite_release" | sort -V | head -n1)" = 25.11 ]; then
		skew_tests=(a_node_newer_than_its_controller_stops_before_slurmd_naming_both_releases)
		if [ "$(printf '%s\n' "$oldest" "$suite_release" | sort -V | head -n1)" = "$oldest" ] && [ "$oldest" != "$suite_release" ]; then
			skew_tests+=(of_several_installed_releases_slurmd_starts_with_the_newest_the_controller_accepts
				of_several_releases_with_a_key_that_differs_one_refused_for_its_protocol_never_starts)
		fi
		SLURM_E2E_NEWER_SLURM_TAR=$(scripts/slurm-build.sh --cache-only "$newest" 2>/dev/null | tail -n1) \
			SLURM_E2E_OLDER_SLURM_TAR=$(scripts/slurm-build.sh --cache-only "$oldest" 2>/dev/null | tail -n1) \
			cargo test -p slurm-e2e --test bootstrap --locked -- --ignored --exact "${skew_tests[@]}"
		# The controller upgraded to the newest release under running jobs (issue 23 §2):
		# nodes from an image with both releases join on the suite's, replacements on the
		# newest; under the upgraded controller a node of the suite's release has its slurmd
		# restarted and another takes the agent's reboot through Slurm while jobs run
		# (issue 41 §2.4). The newest build is bound over /opt/slurm on the controller
		# machine only.
		SLURM_E2E_NEWER_SLURM_TAR=$(scripts/slurm-build.sh --cache-only "$newest" 2>/dev/null | tail -n1) \
			cargo test -p slurm-e2e --test fleet --locked -- --ignored --exact \
			the_controller_upgraded_under_running_jobs_keeps_them_and_replacements_join_on_its_release
	fi
	for v in $SLURM_E2E_FLEET_MATRIX; do
		start=$(date +%s)
		prefix=$(scripts/slurm-build.sh "$v" | tail -n1)
		echo "test.sh: fleet matrix on Slurm $("$prefix/sbin/slurmd" -V | awk '{print $2}') from $prefix" >&2
		SLURM_E2E_VERSION=$v SLURM_E2E_PREFIX=$prefix PATH="$prefix/sbin:$prefix/bin:$PATH" \
			SLURM_E2E_FLEET_NODES=${SLURM_E2E_MATRIX_NODES:-4} \
			cargo test -p slurm-e2e --test fleet --locked -- --exact \
			nodes_booted_at_once_all_join_idle_and_run_a_job_across_all \
			maintenance_reboot_drains_early_reboots_and_returns_to_service \
			the_image_healthcheck_program_run_by_slurmd_drains_and_resumes_its_node \
			a_login_node_on_auth_slurm_submits_sbatch_and_srun_through_sackd_without_munge \
			a_job_asking_for_a_reboot_runs_after_it_and_the_agent_leaves_the_reboot_to_slurm \
			a_mount_unit_rewritten_under_a_running_job_reloads_systemd_once_and_slurmd_and_the_job_stay
		# The exact upgrade budget (issue 25 §4: reservation slots) on this release's
		# slurmctld, with 4 nodes (8 on the suite's release), replacements under the same
		# NodeName and under new ones (issue 37 §4: slot release, dynamic records deleted);
		# repairs within the same budget (issue 38: 3 faulty of 4, budget 1), the breaker
		# (the same fault everywhere), the flap guard (a replacement failing again) and a
		# repair's reboot through Slurm (`scontrol reboot ASAP nextstate=resume`, whose
		# states changed in 25.11 and 26.05), then a replacement for the fault back.
		SLURM_E2E_VERSION=$v SLURM_E2E_PREFIX=$prefix PATH="$prefix/sbin:$prefix/bin:$PATH" \
			SLURM_E2E_FLEET_UPGRADE_NODES=${SLURM_E2E_MATRIX_NODES:-4} \
			cargo test -p slurm-e2e --test fleet --locked -- --exact --test-threads=1 \
			rolling_upgrade_replaces_every_busy_node_from_the_new_image_within_the_budget \
			rolling_upgrade_under_new_node_names_keeps_the_budget_and_leaves_no_old_record \
			faulty_nodes_are_replaced_after_their_jobs_one_budget_slot_at_a_time \
			a_fault_on_every_node_trips_the_breaker_and_no_node_leaves \
			a_replacement_failing_the_same_check_is_not_replaced_again \
			a_reboot_class_fault_reboots_the_node_and_the_same_fault_after_the_boot_replaces_it \
			the_start_up_gate_holds_every_boot_and_a_failing_diagnostic_never_runs_a_job
		echo "test.sh: fleet matrix on Slurm $v passed in $(($(date +%s) - start)) s" >&2
	done
	scripts/slurm-build.sh "$suite_version" >/dev/null
fi
