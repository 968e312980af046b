//! slurm-node-agent library.
