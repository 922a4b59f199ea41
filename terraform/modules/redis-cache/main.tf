# Redis tier for objcache: an ElastiCache (Redis OSS) replication group, TLS and AUTH only.
#
# Unlike the bucket modules there is no reader/writer split here: every client with the
# AUTH token can write. Put Redis in front of the buckets only for clients you would
# trust as writers, or set OBJCACHE_SIGNING_KEY (docs/terraform.md).

resource "aws_elasticache_subnet_group" "this" {
  name        = var.name
  description = "objcache Redis tier ${var.name}"
  subnet_ids  = var.subnet_ids
  tags        = var.tags
}

resource "aws_elasticache_parameter_group" "this" {
  name        = var.name
  description = "objcache Redis tier ${var.name}: evict like a cache"
  family      = "redis7"
  tags        = var.tags

  parameter {
    name  = "maxmemory-policy"
    value = var.maxmemory_policy
  }

  parameter {
    name  = "cluster-enabled"
    value = var.num_node_groups > 0 ? "yes" : "no"
  }
}

# No egress rules: Terraform removes the default allow-all egress, and Redis needs none.
resource "aws_security_group" "this" {
  name        = "${var.name}-redis"
  description = "objcache Redis tier ${var.name}: Redis port from allowed clients only"
  vpc_id      = var.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "from_security_groups" {
  for_each = toset(var.allowed_security_group_ids)

  security_group_id            = aws_security_group.this.id
  description                  = "objcache clients (security group ${each.value})"
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
  referenced_security_group_id = each.value
  tags                         = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "from_cidr_blocks" {
  for_each = toset(var.allowed_cidr_blocks)

  security_group_id = aws_security_group.this.id
  description       = "objcache clients (${each.value})"
  ip_protocol       = "tcp"
  from_port         = var.port
  to_port           = var.port
  cidr_ipv4         = each.value
  tags              = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  #checkov:skip=CKV_AWS_191:A customer-managed KMS key is opt-in via var.kms_key_arn; at-rest encryption is always on (AWS-managed key by default).
  replication_group_id = var.name
  description          = "objcache Redis tier ${var.name}"

  engine               = "redis"
  engine_version       = var.engine_version
  node_type            = var.node_type
  port                 = var.port
  parameter_group_name = aws_elasticache_parameter_group.this.name
  subnet_group_name    = aws_elasticache_subnet_group.this.name
  security_group_ids   = [aws_security_group.this.id]

  # Cluster mode (num_node_groups > 0): shards of a primary and replicas, found through
  # the configuration endpoint; otherwise one primary and num_cache_clusters - 1 replicas.
  num_cache_clusters      = var.num_node_groups > 0 ? null : var.num_cache_clusters
  num_node_groups         = var.num_node_groups > 0 ? var.num_node_groups : null
  replicas_per_node_group = var.num_node_groups > 0 ? var.replicas_per_node_group : null

  # Failover needs a replica. Spelled as conditionals because checkov evaluates those with
  # the variable defaults (CKV2_AWS_50 then checks the real default) but not a bare ">".
  # Cluster mode always has replicas (replicas_per_node_group >= 1).
  automatic_failover_enabled = var.num_node_groups > 0 || var.num_cache_clusters > 1 ? true : false
  multi_az_enabled           = var.num_node_groups > 0 || var.num_cache_clusters > 1 ? true : false

  at_rest_encryption_enabled = true
  kms_key_id                 = var.kms_key_arn
  transit_encryption_enabled = true
  auth_token                 = var.auth_token
  auth_token_update_strategy = var.auth_token_update_strategy

  # A cache is rebuilt, not restored: snapshots would only cost storage.
  snapshot_retention_limit = 0

  auto_minor_version_upgrade = true
  maintenance_window         = var.maintenance_window
  apply_immediately          = var.apply_immediately
  tags                       = var.tags

  lifecycle {
    precondition {
      condition     = var.num_node_groups == 0 || var.database == 0
      error_message = "A Redis Cluster (num_node_groups > 0) has only database 0: set database = 0."
    }
  }
}
