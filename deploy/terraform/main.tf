# gpuval's GPU cluster on AWS, for the Slurm deployment in deploy/slurm: node_count nodes of 8 H100
# (p5.48xlarge) or 8 H200 (p5en.48xlarge) with an EFA on every network card, in one cluster placement group
# (or a capacity reservation's own), and a small Slurm controller that also serves /shared over NFS. Each GPU node pulls gpuval's
# image (deploy/docker/Dockerfile, pushed to GHCR by .github/workflows/ci.yml) and joins Slurm as nodeN,
# the names deploy/slurm/local-cluster.sh uses, in the default partition, so deploy/slurm/*.sbatch run
# as the README shows. No SSH and no public address: reach a node with Session Manager.
#
#   cp terraform.tfvars.example terraform.tfvars      # region, zone, image
#   terraform init && terraform apply
#   terraform output nodes                            # node name => private address
#   aws ssm start-session --target "$(terraform output -raw login_instance_id)"
#   terraform output -raw slurm_accept_command        # run it on node1, in /shared
#
# Checked offline by tests/test_infra.py (python-hcl2, checkov, and against deploy/slurm and deploy/k8s).

terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.74 added efa-only network interfaces (hashicorp/terraform-provider-aws#39882)
      version = ">= 5.74, < 7.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, { "gpuval:cluster" = var.cluster_name })
  }
}

locals {
  # One row per GPU type: the instance, what it carries and the gpuval profile that judges it
  # (src/gpuval/profiles/). https://aws.amazon.com/ec2/instance-types/p5/ : p5.48xlarge has 8 H100 80 GB
  # and 32 network cards, p5en.48xlarge 8 H200 141 GB and 16 network cards (EFAv3), both 3200 Gbps of EFA
  # and 192 vCPUs (2 sockets x 48 cores x 2 threads). The launch template's precondition checks the GPU
  # and card counts against EC2's own description of the instance type.
  gpu_types = {
    h100 = {
      instance_type    = "p5.48xlarge"
      gpus_per_node    = 8
      network_cards    = 32
      profile          = "h100-sxm"
      sockets          = 2
      cores_per_socket = 48
      threads_per_core = 2
    }
    h200 = {
      instance_type    = "p5en.48xlarge"
      gpus_per_node    = 8
      network_cards    = 16
      profile          = "h200-sxm"
      sockets          = 2
      cores_per_socket = 48
      threads_per_core = 2
    }
  }
  gpu = local.gpu_types[var.gpu_type]

  private_cidr = cidrsubnet(var.vpc_cidr, 4, 0)
  public_cidr  = cidrsubnet(var.vpc_cidr, 4, 1)
  # Fixed addresses: slurm.conf names every node before any exists, and each node names the controller.
  controller_ip = cidrhost(local.private_cidr, 10)
  node_names    = [for index in range(var.node_count) : "node${index + 1}"]
  node_ips      = [for index in range(var.node_count) : cidrhost(local.private_cidr, 100 + index)]

  # The layout AWS recommends for P5, P5e and P5en: an ENA interface on card 0 (the node's address), then
  # an EFA-only interface on card 0 (device 1) and on every other card (device 0).
  # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html
  efa_interfaces = concat(
    [{ network_card_index = 0, device_index = 1 }],
    [for card in range(1, local.gpu.network_cards) : { network_card_index = card, device_index = 0 }],
  )

  gpu_ami_id        = coalesce(var.gpu_ami_id, one(data.aws_ami.gpu[*].id))
  controller_ami_id = coalesce(var.controller_ami_id, one(data.aws_ami.ubuntu[*].id))

  slurm_conf = templatefile("${path.module}/templates/slurm.conf.tftpl", {
    cluster_name     = var.cluster_name
    controller_ip    = local.controller_ip
    node_range       = "node[1-${var.node_count}]"
    node_addresses   = join(",", local.node_ips)
    gpus_per_node    = local.gpu.gpus_per_node
    sockets          = local.gpu.sockets
    cores_per_socket = local.gpu.cores_per_socket
    threads_per_core = local.gpu.threads_per_core
  })
  gres_conf = templatefile("${path.module}/templates/gres.conf.tftpl", {
    last_gpu = local.gpu.gpus_per_node - 1
  })
}

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

data "aws_ec2_instance_type" "gpu" {
  instance_type = local.gpu.instance_type
}

data "aws_ami" "gpu" {
  count       = var.gpu_ami_id == null ? 1 : 0
  most_recent = true
  owners      = ["amazon"]

  filter {
    name   = "name"
    values = ["Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) *"]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
}

data "aws_ami" "ubuntu" {
  count       = var.controller_ami_id == null ? 1 : 0
  most_recent = true
  owners      = ["099720109477"] # Canonical

  filter {
    name   = "name"
    values = ["ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"]
  }
}

# --- Network: one private subnet for every node (EFA traffic stays inside a subnet), a NAT gateway for
# the image, packages and Session Manager -------------------------------------------------------------------

resource "aws_vpc" "cluster" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = { Name = var.cluster_name }
}

# Nothing uses the VPC's default security group: it allows nothing.
resource "aws_default_security_group" "default" {
  vpc_id = aws_vpc.cluster.id
}

resource "aws_subnet" "private" {
  vpc_id                  = aws_vpc.cluster.id
  cidr_block              = local.private_cidr
  availability_zone       = var.availability_zone
  map_public_ip_on_launch = false

  tags = { Name = "${var.cluster_name}-private" }
}

resource "aws_subnet" "public" {
  vpc_id                  = aws_vpc.cluster.id
  cidr_block              = local.public_cidr
  availability_zone       = var.availability_zone
  map_public_ip_on_launch = false

  tags = { Name = "${var.cluster_name}-public" }
}

resource "aws_internet_gateway" "cluster" {
  vpc_id = aws_vpc.cluster.id

  tags = { Name = var.cluster_name }
}

resource "aws_eip" "nat" {
  domain = "vpc"

  tags = { Name = "${var.cluster_name}-nat" }
}

resource "aws_nat_gateway" "cluster" {
  allocation_id = aws_eip.nat.id
  subnet_id     = aws_subnet.public.id

  tags       = { Name = var.cluster_name }
  depends_on = [aws_internet_gateway.cluster]
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.cluster.id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.cluster.id
  }

  tags = { Name = "${var.cluster_name}-public" }
}

resource "aws_route_table_association" "public" {
  subnet_id      = aws_subnet.public.id
  route_table_id = aws_route_table.public.id
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.cluster.id

  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.cluster.id
  }

  tags = { Name = "${var.cluster_name}-private" }
}

resource "aws_route_table_association" "private" {
  subnet_id      = aws_subnet.private.id
  route_table_id = aws_route_table.private.id
}

resource "aws_security_group" "cluster" {
  name        = "${var.cluster_name}-nodes"
  description = "gpuval nodes: all traffic among themselves, HTTP(S) out through the NAT gateway"
  vpc_id      = aws_vpc.cluster.id

  # EFA needs all traffic allowed in and out within its security group (EFA user guide, "Prepare an
  # EFA-enabled security group"); the same rule carries NCCL's bootstrap, Slurm and NFS.
  ingress {
    description = "EFA, NCCL bootstrap, Slurm and NFS among the cluster nodes"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }

  egress {
    description = "EFA, NCCL bootstrap, Slurm and NFS among the cluster nodes"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }

  egress {
    description = "HTTPS: the image registry, Session Manager, AWS APIs"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  egress {
    description = "HTTP: Ubuntu package mirrors"
    from_port   = 80
    to_port     = 80
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  tags = { Name = "${var.cluster_name}-nodes" }
}

# Rejected flows only: a blocked rendezvous or NFS port shows up here, the accepted EFA traffic does not.
resource "aws_flow_log" "rejects" {
  vpc_id          = aws_vpc.cluster.id
  traffic_type    = "REJECT"
  log_destination = aws_cloudwatch_log_group.flow_rejects.arn
  iam_role_arn    = aws_iam_role.flow_logs.arn
}

resource "aws_cloudwatch_log_group" "flow_rejects" {
  name              = "/${var.cluster_name}/vpc-flow-rejects"
  retention_in_days = 365
  kms_key_id        = aws_kms_key.cluster.arn
}

resource "aws_kms_key" "cluster" {
  description             = "${var.cluster_name}: the VPC's flow logs and the shared volume"
  enable_key_rotation     = true
  deletion_window_in_days = 7
  policy                  = data.aws_iam_policy_document.cluster_key.json
}

data "aws_iam_policy_document" "cluster_key" {
  # A key policy: its Resource "*" is this key and nothing else (KMS key policies name no other resource).
  #checkov:skip=CKV_AWS_109:a KMS key policy, whose Resource "*" means this key only
  #checkov:skip=CKV_AWS_111:a KMS key policy, whose Resource "*" means this key only
  #checkov:skip=CKV_AWS_356:a KMS key policy, whose Resource "*" means this key only
  statement {
    sid       = "AccountAdministersTheKey"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }

  statement {
    sid       = "CloudWatchLogsEncryptsTheClusterLogs"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${data.aws_partition.current.partition}:logs:${var.region}:${data.aws_caller_identity.current.account_id}:log-group:/${var.cluster_name}/*"]
    }
  }
}

resource "aws_iam_role" "flow_logs" {
  name_prefix        = "${var.cluster_name}-flow-logs-"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_assume.json
}

data "aws_iam_policy_document" "flow_logs_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "flow_logs" {
  name   = "write-flow-rejects"
  role   = aws_iam_role.flow_logs.id
  policy = data.aws_iam_policy_document.flow_logs_write.json
}

data "aws_iam_policy_document" "flow_logs_write" {
  statement {
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = ["${aws_cloudwatch_log_group.flow_rejects.arn}:*"]
  }
}

# --- Instance identity: Session Manager only (no SSH keys, no inbound port) ------------------------------

resource "aws_iam_role" "node" {
  name_prefix        = "${var.cluster_name}-node-"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy_attachment" "node_session_manager" {
  role       = aws_iam_role.node.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "node" {
  name_prefix = "${var.cluster_name}-node-"
  role        = aws_iam_role.node.name
}

# --- Slurm controller, NFS server of /shared and of the munge key ----------------------------------------

# /shared and the munge key live on their own volume: they outlive a controller replaced by a new
# node_count (its slurm.conf is in its user data).
resource "aws_ebs_volume" "shared" {
  availability_zone = var.availability_zone
  size              = var.shared_volume_gb
  type              = "gp3"
  encrypted         = true
  kms_key_id        = aws_kms_key.cluster.arn

  tags = { Name = "${var.cluster_name}-shared" }
}

resource "aws_volume_attachment" "shared" {
  device_name = "/dev/sdf"
  volume_id   = aws_ebs_volume.shared.id
  instance_id = aws_instance.controller.id
}

resource "aws_instance" "controller" {
  ami                         = local.controller_ami_id
  instance_type               = var.controller_instance_type
  subnet_id                   = aws_subnet.private.id
  private_ip                  = local.controller_ip
  vpc_security_group_ids      = [aws_security_group.cluster.id]
  iam_instance_profile        = aws_iam_instance_profile.node.name
  associate_public_ip_address = false
  ebs_optimized               = true
  monitoring                  = true
  user_data_replace_on_change = true

  user_data = templatefile("${path.module}/templates/controller.sh.tftpl", {
    slurm_conf    = local.slurm_conf
    gres_conf     = local.gres_conf
    private_cidr  = local.private_cidr
    shared_serial = replace(aws_ebs_volume.shared.id, "-", "")
  })

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = 50
    encrypted   = true
  }

  tags = { Name = "${var.cluster_name}-controller" }
}

# --- GPU nodes -------------------------------------------------------------------------------------------

# Nodes close together on the network, unless a reservation brings its own placement (an On-Demand
# Capacity Reservation is made in a placement group of its own, a Capacity Block is co-located already).
resource "aws_placement_group" "gpu" {
  count    = var.capacity_reservation_id == null ? 1 : 0
  name     = "${var.cluster_name}-gpu"
  strategy = "cluster"
}

# One launch template per node: its primary interface carries the node's fixed address (slurm.conf's
# NodeAddr), and only a launch template attaches the EFA interfaces at launch.
resource "aws_launch_template" "gpu" {
  count                  = var.node_count
  name_prefix            = "${var.cluster_name}-${local.node_names[count.index]}-"
  image_id               = local.gpu_ami_id
  instance_type          = local.gpu.instance_type
  ebs_optimized          = true
  update_default_version = true

  user_data = base64encode(templatefile("${path.module}/templates/gpu-node.sh.tftpl", {
    node_name     = local.node_names[count.index]
    controller_ip = local.controller_ip
    gpuval_image  = var.gpuval_image
    profile       = local.gpu.profile
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.node.arn
  }

  dynamic "placement" {
    for_each = aws_placement_group.gpu[*].name

    content {
      group_name = placement.value
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  block_device_mappings {
    device_name = "/dev/sda1" # the root device of Ubuntu AMIs, the DLAMI's included

    ebs {
      volume_type           = "gp3"
      volume_size           = var.root_volume_gb
      encrypted             = true
      delete_on_termination = true
    }
  }

  network_interfaces {
    network_card_index          = 0
    device_index                = 0
    subnet_id                   = aws_subnet.private.id
    private_ip_address          = local.node_ips[count.index]
    security_groups             = [aws_security_group.cluster.id]
    associate_public_ip_address = false
    delete_on_termination       = true
  }

  dynamic "network_interfaces" {
    for_each = var.efa_enabled ? local.efa_interfaces : []

    content {
      network_card_index    = network_interfaces.value.network_card_index
      device_index          = network_interfaces.value.device_index
      interface_type        = "efa-only"
      subnet_id             = aws_subnet.private.id
      security_groups       = [aws_security_group.cluster.id]
      delete_on_termination = true
    }
  }

  dynamic "capacity_reservation_specification" {
    for_each = var.capacity_reservation_id == null ? [] : [var.capacity_reservation_id]

    content {
      capacity_reservation_target {
        capacity_reservation_id = capacity_reservation_specification.value
      }
    }
  }

  dynamic "instance_market_options" {
    for_each = var.capacity_block ? ["capacity-block"] : []

    content {
      market_type = instance_market_options.value
    }
  }

  lifecycle {
    precondition {
      condition = (
        one(data.aws_ec2_instance_type.gpu.gpus[*].count) == local.gpu.gpus_per_node
        && data.aws_ec2_instance_type.gpu.maximum_network_cards == local.gpu.network_cards
      )
      error_message = "${local.gpu.instance_type} does not have ${local.gpu.gpus_per_node} GPUs and ${local.gpu.network_cards} network cards: correct local.gpu_types."
    }
  }
}

resource "aws_instance" "gpu" {
  # checkov reads these settings on the instance, not in the launch template that carries them:
  #checkov:skip=CKV_AWS_79:IMDSv2 only (http_tokens = required) is set in aws_launch_template.gpu
  #checkov:skip=CKV_AWS_126:detailed monitoring is enabled in aws_launch_template.gpu
  #checkov:skip=CKV_AWS_135:ebs_optimized is set in aws_launch_template.gpu
  #checkov:skip=CKV_AWS_8:the root volume is encrypted in aws_launch_template.gpu
  #checkov:skip=CKV2_AWS_41:the instance profile (aws_iam_instance_profile.node) is set in aws_launch_template.gpu
  count = var.node_count

  launch_template {
    id      = aws_launch_template.gpu[count.index].id
    version = aws_launch_template.gpu[count.index].latest_version
  }

  tags = { Name = "${var.cluster_name}-${local.node_names[count.index]}", "gpuval:slurm-node" = local.node_names[count.index] }
}
