# slurm-node-agent %post: the state and runtime folders (tmpfiles.d; never the package's,
# so that removing the package keeps the state), and systemd told of the new units. The
# units are not enabled here: an image enables them, as Slurm's own packages leave slurmd
# to the site.
systemd-tmpfiles --create /usr/lib/tmpfiles.d/slurm-node-agent.conf || :
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || :
fi
