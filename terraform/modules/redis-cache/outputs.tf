output "primary_endpoint_address" {
  description = "DNS name of the primary (read-write) endpoint; null in cluster mode."
  value       = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "configuration_endpoint_address" {
  description = "Cluster mode: DNS name of the configuration endpoint (objcache discovers every shard through it); null otherwise."
  value       = aws_elasticache_replication_group.this.configuration_endpoint_address
}

output "port" {
  description = "TCP port of the Redis endpoint."
  value       = var.port
}

output "tiers_fragment" {
  description = "This cache as an OBJCACHE_TIERS entry without the secret: rediss://<host>:<port>/<db>, the host being the configuration endpoint in cluster mode. At runtime insert the AUTH token as rediss://:<token>@<host>:<port>/<db>; the token is never part of an output."
  value       = "rediss://${var.num_node_groups > 0 ? aws_elasticache_replication_group.this.configuration_endpoint_address : aws_elasticache_replication_group.this.primary_endpoint_address}:${var.port}/${var.database}"
}

output "security_group_id" {
  description = "Security group of the cache nodes; add ingress rules to it for more clients."
  value       = aws_security_group.this.id
}

output "replication_group_id" {
  description = "ID of the ElastiCache replication group."
  value       = aws_elasticache_replication_group.this.id
}
