# slurm-node-agent %postun: systemd forgets removed units. /var/lib/slurm-node-agent (the
# agent's state) stays.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || :
fi
