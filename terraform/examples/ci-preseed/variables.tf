variable "region" {
  description = "AWS region of the cache bucket."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "bucket_name" {
  description = "Globally unique name of the cache bucket."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be 3-63 lowercase letters, digits and hyphens, starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix inside the bucket."
  type        = string
  default     = "objcache"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.prefix))
    error_message = "prefix must be '/'-separated segments of letters, digits, '.', '_' or '-', without leading or trailing '/'."
  }
}

variable "expiration_days" {
  description = "Days before cache entries expire; the pre-seeding job should run more often than this."
  type        = number
  default     = 30

  validation {
    condition     = var.expiration_days > 0 && floor(var.expiration_days) == var.expiration_days
    error_message = "expiration_days must be a whole number greater than 0."
  }
}

variable "github_subjects" {
  description = "GitHub OIDC \"sub\" claims allowed to assume the CI writer role, e.g. [\"repo:my-org/my-repo:ref:refs/heads/main\"]. Pull-request workflows should not be listed: they would let unreviewed code write entries the fleet loads."
  type        = list(string)

  validation {
    condition     = length(var.github_subjects) > 0 && alltrue([for s in var.github_subjects : can(regex("^repo:[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+:.+$", s))])
    error_message = "github_subjects must be non-empty, each starting with repo:<owner>/<repo>: with no wildcard in owner or repo."
  }
}

variable "create_github_oidc_provider" {
  description = "Create the account's token.actions.githubusercontent.com OIDC provider. Set to false when the account already has one (there can be only one per URL)."
  type        = bool
  default     = true
}

variable "ci_role_name" {
  description = "Name of the CI writer role."
  type        = string
  default     = "objcache-ci-writer"

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.ci_role_name))
    error_message = "ci_role_name must be 1-64 characters valid in IAM role names."
  }
}

variable "fleet_role_name" {
  description = "Name of the fleet reader role and its EC2 instance profile."
  type        = string
  default     = "objcache-fleet-reader"

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.fleet_role_name))
    error_message = "fleet_role_name must be 1-64 characters valid in IAM role names."
  }
}

variable "tags" {
  description = "Default tags for every resource."
  type        = map(string)
  default     = { "app" = "objcache" }
}

variable "signing_key_secret_arn" {
  description = "ARN of a Secrets Manager secret holding CI's Ed25519 private key (the PEM file `objcache keygen` writes). Created outside Terraform, so the private key never enters Terraform state. Only the CI writer role may read it. null: entries are not signed."
  type        = string
  default     = null

  validation {
    condition     = var.signing_key_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:", var.signing_key_secret_arn))
    error_message = "signing_key_secret_arn must be a Secrets Manager secret ARN."
  }
}

variable "verify_keys" {
  description = "Ed25519 public keys (`ed25519:<base64>` lines as `objcache keygen` prints them) the fleet accepts; several give a rotation window. Public: they go into the fleet's environment as OBJCACHE_VERIFY_KEYS."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for k in var.verify_keys : can(regex("^ed25519:[A-Za-z0-9+/]{43}=$", k))])
    error_message = "Each verify key must be an ed25519:<base64> line printed by objcache keygen."
  }
}
