# Inputs of the gpuval GPU cluster on AWS (main.tf). terraform.tfvars.example shows a filled-in set.

variable "region" {
  description = "AWS region with P5/P5en capacity, e.g. us-east-1."
  type        = string
}

variable "availability_zone" {
  description = "The one zone every node lives in (a cluster placement group spans one zone); the zone of the capacity reservation when there is one."
  type        = string
}

variable "cluster_name" {
  description = "Slurm ClusterName and the prefix of every resource's Name tag."
  type        = string
  default     = "gpuval"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}$", var.cluster_name))
    error_message = "cluster_name: lower-case letters, digits and '-', starting with a letter, at most 31 characters."
  }
}

variable "node_count" {
  description = "GPU nodes (Slurm node1..nodeN). The default matches deploy/k8s (completions: 2) and the README's `sbatch --nodes=2`."
  type        = number
  default     = 2

  validation {
    condition     = var.node_count >= 1 && var.node_count == floor(var.node_count)
    error_message = "node_count: a whole number of nodes, at least 1."
  }
}

variable "gpu_type" {
  description = "h100 (p5.48xlarge: 8x H100 80 GB SXM) or h200 (p5en.48xlarge: 8x H200 141 GB SXM); see local.gpu_types in main.tf."
  type        = string
  default     = "h100"

  validation {
    condition     = contains(["h100", "h200"], var.gpu_type)
    error_message = "gpu_type: h100 or h200."
  }
}

variable "gpuval_image" {
  description = "gpuval's container image as CI pushes it (ghcr.io/OWNER/REPO:TAG), pinned to a release tag or a digest. A private package needs `docker login ghcr.io` on the nodes first."
  type        = string

  validation {
    condition     = can(regex("^[^:@]+(:[A-Za-z0-9_.-]+|@sha256:[0-9a-f]{64})$", var.gpuval_image)) && !endswith(var.gpuval_image, ":latest")
    error_message = "gpuval_image: name the image with a release tag or a digest (not :latest), so every node runs the same gpuval."
  }
}

variable "gpu_ami_id" {
  description = "AMI of the GPU nodes; null takes the newest AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04), which has the driver, the EFA software, Docker and the NVIDIA Container Toolkit."
  type        = string
  default     = null
}

variable "controller_ami_id" {
  description = "AMI of the Slurm controller; null takes the newest Canonical Ubuntu 24.04 (the same Slurm release as the GPU nodes')."
  type        = string
  default     = null
}

variable "controller_instance_type" {
  description = "The Slurm controller, which also serves the shared folder (/shared) over NFS."
  type        = string
  default     = "m7i.2xlarge"
}

variable "efa_enabled" {
  description = "Attach an EFA to every network card of the GPU nodes (32 on p5.48xlarge, 16 on p5en.48xlarge). false: one ENA interface only, NCCL over TCP sockets (a smoke test, not a bandwidth acceptance)."
  type        = bool
  default     = true
}

variable "vpc_cidr" {
  description = "The cluster VPC's IPv4 range; the private (nodes) and public (NAT gateway) subnets are carved from it."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && tonumber(split("/", var.vpc_cidr)[1]) <= 20
    error_message = "vpc_cidr: an IPv4 CIDR block of /20 or larger."
  }
}

variable "capacity_reservation_id" {
  description = "On-Demand Capacity Reservation or Capacity Block (cr-...) to launch the GPU nodes into, which then brings its own placement; null launches On-Demand into a new cluster placement group."
  type        = string
  default     = null
}

variable "capacity_block" {
  description = "true when capacity_reservation_id is an EC2 Capacity Block for ML (the launch then asks for market type capacity-block)."
  type        = bool
  default     = false
}

variable "root_volume_gb" {
  description = "Root volume of each GPU node (gp3): the gpuval image unpacks to about 20 GB, plus the DLAMI itself."
  type        = number
  default     = 300
}

variable "shared_volume_gb" {
  description = "The controller's second volume (gp3, encrypted): /shared, the results folder every node mounts, and the munge key; it outlives the controller."
  type        = number
  default     = 500
}

variable "tags" {
  description = "Extra tags on every resource (owner, cost centre)."
  type        = map(string)
  default     = {}
}
