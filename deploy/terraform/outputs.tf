# What a person needs after `terraform apply`: where the nodes are and how to run gpuval on them.

output "nodes" {
  description = "Slurm node name => private address of each GPU node (slurm.conf's NodeAddr)."
  value       = zipmap(local.node_names, aws_instance.gpu[*].private_ip)
}

output "node_instance_ids" {
  description = "Slurm node name => EC2 instance id, for `aws ssm start-session --target`."
  value       = zipmap(local.node_names, aws_instance.gpu[*].id)
}

output "controller_private_ip" {
  description = "The Slurm controller and NFS server of /shared."
  value       = aws_instance.controller.private_ip
}

output "login_instance_id" {
  description = "node1's instance id: jobs are submitted there (the sbatch scripts live in /opt/gpuval/deploy/slurm)."
  value       = aws_instance.gpu[0].id
}

output "gpu_instance_type" {
  description = "The GPU nodes' instance type and what it carries."
  value       = "${local.gpu.instance_type}: ${local.gpu.gpus_per_node} GPUs (${var.gpu_type}), ${var.efa_enabled ? local.gpu.network_cards : 0} EFA network cards"
}

output "slurm_accept_command" {
  description = "gpuval accept on every node, as the README runs it; on node1, from /shared (results land in /shared/gpuval-results)."
  value       = "cd /shared && sbatch --wait --nodes=${var.node_count} --ntasks-per-node=${local.gpu.gpus_per_node} --gpus-per-node=${local.gpu.gpus_per_node} /opt/gpuval/deploy/slurm/accept.sbatch --profile ${local.gpu.profile}"
}
