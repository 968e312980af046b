# Inputs of the compute node image. `slurm-image-builder plan` prints the values it would
# pass; `slurm-image-builder validate` checks every value it passes against these
# declarations (name and type). Checksums come from ../packer/sources.toml.

variable "os" {
  type        = string
  description = "Base OS: al2023, ubuntu-22.04, ubuntu-24.04 or rocky9 (keys of local.os_catalog)."
  default     = "al2023"
}

variable "arch" {
  type        = string
  description = "CPU architecture of the image: x86_64 or arm64."
  default     = "x86_64"
}

variable "region" {
  type        = string
  description = "Region the build instance runs in."
  default     = "us-east-1"
}

variable "ami_regions" {
  type        = list(string)
  description = "Further regions the finished AMI is copied to."
  default     = []
}

variable "instance_type" {
  type        = string
  description = "Build instance type; empty picks a default for the architecture."
  default     = ""
}

variable "subnet_id" {
  type        = string
  description = "Subnet for the build instance; empty uses the default VPC."
  default     = ""
}

variable "root_volume_size_gib" {
  type        = number
  description = "Size of the encrypted root volume in GiB."
  default     = 40
}

variable "kms_key_id" {
  type        = string
  description = "KMS key for the root volume; empty uses the account's default EBS key."
  default     = ""
}

variable "image_name_prefix" {
  type        = string
  description = "AMI names are <prefix>-<os>-<arch>-slurm-<version>-<timestamp>."
  default     = "slurm-node"
}

variable "slurm_version" {
  type        = string
  description = "Slurm version, e.g. 24.11.7; with slurm_versions, the default one. With slurm_source = distro it is the version the distribution must ship."
}

variable "slurm_versions" {
  type = list(object({
    version = string
    url     = string
    sha256  = string
  }))
  description = "Every Slurm version of the image with its pinned tarball (from sources.toml). Two or more (slurm_source = tarball): each is installed in /opt/slurm-<version> and /opt/slurm is a symlink to slurm_version's, the default. Empty or one entry: slurm_version alone in /opt/slurm."
  default     = []
}

variable "slurm_source" {
  type        = string
  description = "tarball (build the pinned, sha256-verified source), debian-source (build Debian's own source package the same way) or distro (the distribution's packages)."
  default     = "tarball"
}

variable "slurm_url" {
  type        = string
  description = "URL of the Slurm source tarball (from sources.toml); empty with slurm_source = distro."
  default     = ""
}

variable "slurm_sha256" {
  type        = string
  description = "sha256 of the Slurm source tarball (from sources.toml)."
  default     = ""
}

variable "auth" {
  type        = string
  description = "The auth plugins the image can join with: munge (auth/munge only), slurm (auth/slurm only, no MUNGE) or munge+slurm (both; each node's join picks). auth/slurm needs Slurm 23.11 or later."
  default     = "munge+slurm"
}

variable "munge_version" {
  type        = string
  description = "MUNGE version built from source where the OS has no munge package (al2023)."
  default     = "0.5.15"
}

variable "munge_url" {
  type        = string
  description = "URL of the MUNGE source tarball (from sources.toml)."
  default     = ""
}

variable "munge_sha256" {
  type        = string
  description = "sha256 of the MUNGE source tarball (from sources.toml)."
  default     = ""
}

variable "efa_installer_version" {
  type        = string
  description = "EFA installer version; empty leaves EFA out."
  default     = "1.41.0"
}

variable "efa_installer_url" {
  type        = string
  description = "URL of the EFA installer tarball (from sources.toml)."
  default     = ""
}

variable "efa_installer_sha256" {
  type        = string
  description = "sha256 of the EFA installer tarball (from sources.toml)."
  default     = ""
}

variable "lustre_client" {
  type        = bool
  description = "Install the FSx for Lustre client matched to the installed kernel."
  default     = true
}

variable "nvidia_driver_version" {
  type        = string
  description = "NVIDIA driver branch (550) or exact version (580.126.09: the driver and Fabric Manager pinned and held at it); empty leaves the driver out."
  default     = ""
}

variable "nvidia_dcgm" {
  type        = bool
  description = "Install NVIDIA DCGM (needs nvidia_driver_version)."
  default     = false
}

variable "cloudwatch_agent" {
  type        = bool
  description = "Install the CloudWatch agent, shipping the journal of slurmd and slurm-node-agent."
  default     = false
}

variable "agent_version" {
  type        = string
  description = "Version of slurm-node-agent baked in (recorded in tags and build-info)."
  default     = "0.0.0-dev"
}

variable "agent_dir" {
  type        = string
  description = "Local folder holding the agent build: slurm-node-agent, units/ and agent.toml."
  default     = "build/agent"
}

variable "sources_dir" {
  type        = string
  description = "Local folder of pre-fetched, sha256-verified sources (may be empty)."
  default     = "build/sources"
}

variable "allow_skips" {
  type        = bool
  description = "Let steps whose sources are unreachable skip with a message instead of failing."
  default     = false
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for the AMI, its snapshots and the build instance."
  default     = {}
}

variable "manifest_path" {
  type        = string
  description = "Where the manifest post-processor records the artifacts."
  default     = "manifest.json"
}
