variable "name" {
  description = "Replication group ID; also names the subnet group, parameter group and security group."
  type        = string

  validation {
    # ElastiCache replication group IDs: 1-40 chars, lowercase letter first, letters,
    # digits and single hyphens, no trailing hyphen.
    condition     = can(regex("^[a-z](-?[a-z0-9])*$", var.name)) && length(var.name) <= 40
    error_message = "name must be 1-40 lowercase letters, digits and single hyphens, start with a letter and not end with a hyphen."
  }
}

variable "vpc_id" {
  description = "VPC that hosts the cache nodes."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123abcd."
  }
}

variable "subnet_ids" {
  description = "Private subnets for the cache nodes; use subnets in at least two availability zones when num_cache_clusters > 1."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must be a non-empty list of subnet IDs (subnet-...)."
  }
}

variable "allowed_security_group_ids" {
  description = "Security groups (of CI runners and fleet nodes) allowed to connect to the Redis port."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for s in var.allowed_security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "allowed_security_group_ids must be security group IDs (sg-...)."
  }
}

variable "allowed_cidr_blocks" {
  description = "IPv4 CIDR blocks allowed to connect to the Redis port, e.g. the VPC CIDR. 0.0.0.0/0 is refused."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.allowed_cidr_blocks : can(cidrhost(c, 0)) && !strcontains(c, ":") && c != "0.0.0.0/0"])
    error_message = "allowed_cidr_blocks must be valid IPv4 CIDR blocks other than 0.0.0.0/0."
  }
}

variable "node_type" {
  description = "Cache node type. Memory-optimized nodes suit compile artifacts (entries of tens of KB to a few MB)."
  type        = string
  default     = "cache.r7g.large"

  validation {
    condition     = startswith(var.node_type, "cache.")
    error_message = "node_type must be an ElastiCache node type such as cache.r7g.large."
  }
}

variable "engine_version" {
  description = "Redis OSS engine version (major.minor)."
  type        = string
  default     = "7.1"

  validation {
    condition     = can(regex("^7\\.[0-9]+$", var.engine_version))
    error_message = "engine_version must be a Redis 7.x version: the parameter group family is redis7."
  }
}

variable "num_cache_clusters" {
  description = "Number of nodes (1 primary plus replicas). 2 or more enables automatic failover and Multi-AZ."
  type        = number
  default     = 2

  validation {
    condition     = var.num_cache_clusters >= 1 && var.num_cache_clusters <= 6 && floor(var.num_cache_clusters) == var.num_cache_clusters
    error_message = "num_cache_clusters must be a whole number from 1 to 6."
  }
}

variable "num_node_groups" {
  description = "Cluster mode: number of shards (node groups), each a primary with replicas_per_node_group replicas; objcache finds the cluster through the configuration endpoint. 0 (default): cluster mode disabled, one primary with num_cache_clusters - 1 replicas."
  type        = number
  default     = 0

  validation {
    condition     = var.num_node_groups >= 0 && var.num_node_groups <= 500 && floor(var.num_node_groups) == var.num_node_groups
    error_message = "num_node_groups must be a whole number from 0 (cluster mode disabled) to 500."
  }
}

variable "replicas_per_node_group" {
  description = "Cluster mode: replicas of each shard's primary (1 to 5); a replica takes over when its primary fails."
  type        = number
  default     = 1

  validation {
    condition     = var.replicas_per_node_group >= 1 && var.replicas_per_node_group <= 5 && floor(var.replicas_per_node_group) == var.replicas_per_node_group
    error_message = "replicas_per_node_group must be a whole number from 1 to 5."
  }
}

variable "port" {
  description = "TCP port of the Redis endpoint."
  type        = number
  default     = 6379

  validation {
    condition     = var.port >= 1024 && var.port <= 65535 && floor(var.port) == var.port
    error_message = "port must be a whole number from 1024 to 65535."
  }
}

variable "database" {
  description = "Redis logical database number used in the OBJCACHE_TIERS URL (0 in cluster mode: a cluster has no other)."
  type        = number
  default     = 0

  validation {
    condition     = var.database >= 0 && var.database <= 15 && floor(var.database) == var.database
    error_message = "database must be a whole number from 0 to 15."
  }
}

variable "auth_token" {
  description = "Redis AUTH token (16-128 characters). Restricted to URL-safe characters so that it can be put into a rediss:// URL without percent-encoding. It is stored in the Terraform state: keep the state encrypted and access-controlled."
  type        = string
  sensitive   = true
  nullable    = false

  validation {
    condition     = can(regex("^[A-Za-z0-9_~.-]{16,128}$", var.auth_token))
    error_message = "auth_token must be 16-128 characters of letters, digits, '_', '~', '.' or '-'."
  }
}

variable "auth_token_update_strategy" {
  description = "How a changed auth_token is applied: ROTATE (old and new tokens both valid, default) or SET (only the new one; use it once every client has the new token)."
  type        = string
  default     = "ROTATE"

  validation {
    condition     = contains(["ROTATE", "SET"], var.auth_token_update_strategy)
    error_message = "auth_token_update_strategy must be ROTATE or SET."
  }
}

variable "kms_key_arn" {
  description = "ARN of a customer-managed KMS key for encryption at rest, or null (default) for the AWS-managed key."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be null or a KMS key ARN."
  }
}

variable "maxmemory_policy" {
  description = "Eviction policy when memory is full. allkeys-lru (default) makes Redis behave as a cache; the ElastiCache default volatile-lru evicts only keys that have a TTL, so a full node holding entries without TTLs would refuse writes."
  type        = string
  default     = "allkeys-lru"

  validation {
    condition     = contains(["allkeys-lru", "allkeys-lfu", "allkeys-random"], var.maxmemory_policy)
    error_message = "maxmemory_policy must be allkeys-lru, allkeys-lfu or allkeys-random: other policies can refuse cache writes when memory is full."
  }
}

variable "maintenance_window" {
  description = "Weekly maintenance window (ddd:hh24:mi-ddd:hh24:mi, UTC), or null to let AWS choose."
  type        = string
  default     = null

  validation {
    condition     = var.maintenance_window == null || can(regex("^(mon|tue|wed|thu|fri|sat|sun):[0-2][0-9]:[0-5][0-9]-(mon|tue|wed|thu|fri|sat|sun):[0-2][0-9]:[0-5][0-9]$", var.maintenance_window))
    error_message = "maintenance_window must be null or ddd:hh24:mi-ddd:hh24:mi."
  }
}

variable "apply_immediately" {
  description = "Apply changes immediately instead of in the next maintenance window."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags applied to every resource that supports them."
  type        = map(string)
  default     = {}
}
