# Compute node image for Slurm clusters that run slurm-node-agent.
#
# Build with `slurm-image-builder build` (it resolves versions and checksums from
# sources.toml and passes them as variables), or directly:
#   packer init . && packer build -var slurm_version=24.11.7 -var slurm_sha256=... .
# The provisioning steps live in scripts/NN-*.sh; the last one runs the acceptance checks.

packer {
  required_version = ">= 1.10.0"
  required_plugins {
    amazon = {
      version = ">= 1.3.0"
      source  = "github.com/hashicorp/amazon"
    }
  }
}

locals {
  # One entry per supported base OS. `slurm-image-builder plan` reads this map to reject
  # an unknown OS or architecture before Packer starts.
  os_catalog = {
    "al2023" = {
      family       = "rpm"
      owner        = "amazon"
      ssh_username = "ec2-user"
      root_device  = "/dev/xvda"
      glibc        = "2.34"
      ami_name = {
        x86_64 = "al2023-ami-2023.*-kernel-6.1-x86_64"
        arm64  = "al2023-ami-2023.*-kernel-6.1-arm64"
      }
    }
    "ubuntu-22.04" = {
      family       = "deb"
      owner        = "099720109477"
      ssh_username = "ubuntu"
      root_device  = "/dev/sda1"
      glibc        = "2.35"
      ami_name = {
        x86_64 = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
        arm64  = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-arm64-server-*"
      }
    }
    "ubuntu-24.04" = {
      family       = "deb"
      owner        = "099720109477"
      ssh_username = "ubuntu"
      root_device  = "/dev/sda1"
      glibc        = "2.39"
      ami_name = {
        x86_64 = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
        arm64  = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-*"
      }
    }
    "rocky9" = {
      family       = "rpm"
      owner        = "792107900819"
      ssh_username = "rocky"
      root_device  = "/dev/sda1"
      glibc        = "2.34"
      ami_name = {
        x86_64 = "Rocky-9-EC2-Base-9.*.x86_64"
        arm64  = "Rocky-9-EC2-Base-9.*.aarch64"
      }
    }
  }

  os            = local.os_catalog[var.os]
  instance_type = var.instance_type != "" ? var.instance_type : (var.arch == "arm64" ? "c7g.xlarge" : "c6i.xlarge")
  timestamp     = formatdate("YYYYMMDDhhmmss", timestamp())
  ami_name      = "${var.image_name_prefix}-${var.os}-${var.arch}-slurm-${var.slurm_version}-${local.timestamp}"
  staging       = "/tmp/slurm-image"

  # Every Slurm version of the image, space-separated (slurm_version alone without a list).
  slurm_versions = length(var.slurm_versions) > 0 ? join(" ", [for s in var.slurm_versions : s.version]) : var.slurm_version

  # Every version that went into the image, on the AMI, its snapshots and in the manifest.
  version_tags = {
    "slurm-image:os"                    = var.os
    "slurm-image:arch"                  = var.arch
    "slurm-image:slurm-version"         = var.slurm_version
    "slurm-image:slurm-versions"        = local.slurm_versions
    "slurm-image:slurm-source"          = var.slurm_source
    "slurm-image:auth"                  = var.auth
    "slurm-image:efa-installer-version" = var.efa_installer_version
    "slurm-image:lustre-client"         = tostring(var.lustre_client)
    "slurm-image:nvidia-driver-version" = var.nvidia_driver_version
    "slurm-image:nvidia-dcgm"           = tostring(var.nvidia_dcgm)
    "slurm-image:cloudwatch-agent"      = tostring(var.cloudwatch_agent)
    "slurm-image:agent-version"         = var.agent_version
  }
  tags = merge(var.tags, local.version_tags, { Name = local.ami_name })

  # SLURM_VERSIONS and SLURM_DEFAULT, and each version's tarball as SLURM_URL_<version>
  # and SLURM_SHA256_<version> (other than letters and digits as underscores:
  # SLURM_URL_25_11_6), for 30-slurm.sh.
  slurm_versions_env = concat(
    ["SLURM_VERSIONS=${local.slurm_versions}", "SLURM_DEFAULT=${var.slurm_version}"],
    flatten([for s in var.slurm_versions : [
      "SLURM_URL_${regex_replace(s.version, "[^0-9A-Za-z]", "_")}=${s.url}",
      "SLURM_SHA256_${regex_replace(s.version, "[^0-9A-Za-z]", "_")}=${s.sha256}",
    ]]),
  )

  step_env = concat([
    "IMAGE_STAGING=${local.staging}",
    "IMAGE_OS=${var.os}",
    "IMAGE_ARCH=${var.arch}",
    "SLURM_VERSION=${var.slurm_version}",
    "SLURM_SOURCE=${var.slurm_source}",
    "SLURM_URL=${var.slurm_url}",
    "SLURM_SHA256=${var.slurm_sha256}",
    "SLURM_AUTH=${var.auth}",
    "MUNGE_VERSION=${var.munge_version}",
    "MUNGE_URL=${var.munge_url}",
    "MUNGE_SHA256=${var.munge_sha256}",
    "EFA_INSTALLER_VERSION=${var.efa_installer_version}",
    "EFA_INSTALLER_URL=${var.efa_installer_url}",
    "EFA_INSTALLER_SHA256=${var.efa_installer_sha256}",
    "LUSTRE_CLIENT=${var.lustre_client}",
    "NVIDIA_DRIVER_VERSION=${var.nvidia_driver_version}",
    "NVIDIA_DCGM=${var.nvidia_dcgm}",
    "CLOUDWATCH_AGENT=${var.cloudwatch_agent}",
    "IMAGE_REGION=${var.region}",
    "AGENT_VERSION=${var.agent_version}",
    "ALLOW_SKIPS=${var.allow_skips}",
  ], local.slurm_versions_env)
}

source "amazon-ebs" "node" {
  region        = var.region
  ami_regions   = var.ami_regions
  instance_type = local.instance_type
  subnet_id     = var.subnet_id
  ssh_username  = local.os.ssh_username
  ami_name      = local.ami_name

  source_ami_filter {
    filters = {
      name                = local.os.ami_name[var.arch]
      architecture        = var.arch
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    owners      = [local.os.owner]
    most_recent = true
  }

  # The build instance and every instance launched from the image use IMDSv2 only.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  imds_support = "v2.0"

  launch_block_device_mappings {
    device_name           = local.os.root_device
    volume_size           = var.root_volume_size_gib
    volume_type           = "gp3"
    encrypted             = true
    kms_key_id            = var.kms_key_id
    delete_on_termination = true
  }
  encrypt_boot = true
  kms_key_id   = var.kms_key_id

  tags            = local.tags
  snapshot_tags   = local.tags
  run_tags        = local.tags
  run_volume_tags = local.tags
}

build {
  sources = ["source.amazon-ebs.node"]

  provisioner "shell" {
    inline = ["mkdir -p ${local.staging}/scripts ${local.staging}/files ${local.staging}/agent ${local.staging}/sources"]
  }

  provisioner "file" {
    source      = "${path.root}/scripts/"
    destination = "${local.staging}/scripts"
  }

  provisioner "file" {
    source      = "${path.root}/files/"
    destination = "${local.staging}/files"
  }

  provisioner "file" {
    source      = "${var.agent_dir}/"
    destination = "${local.staging}/agent"
  }

  provisioner "file" {
    source      = "${var.sources_dir}/"
    destination = "${local.staging}/sources"
  }

  provisioner "shell" {
    environment_vars = local.step_env
    execute_command  = "chmod +x {{ .Path }}; sudo -E env {{ .Vars }} bash '{{ .Path }}'"
    scripts = [
      "${path.root}/scripts/10-base.sh",
      "${path.root}/scripts/20-munge.sh",
      "${path.root}/scripts/30-slurm.sh",
      "${path.root}/scripts/40-efa.sh",
      "${path.root}/scripts/50-lustre.sh",
      "${path.root}/scripts/60-nvidia.sh",
      "${path.root}/scripts/65-services.sh",
      "${path.root}/scripts/70-agent.sh",
      "${path.root}/scripts/80-hardening.sh",
      "${path.root}/scripts/90-cleanup.sh",
      "${path.root}/scripts/99-acceptance.sh",
    ]
  }

  post-processor "manifest" {
    output     = var.manifest_path
    strip_path = true
    custom_data = merge(local.version_tags, {
      ami_name = local.ami_name
    })
  }
}
