variable "bucket_name" {
  description = "Name of the S3 bucket that holds the cache. Globally unique; the bucket is meant to be dedicated to objcache."
  type        = string

  validation {
    # S3 general purpose bucket naming rules: 3-63 chars, lowercase letters, digits,
    # dots and hyphens, starting and ending with a letter or digit.
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit."
  }

  validation {
    condition = (
      !can(regex("\\.\\.", var.bucket_name)) &&
      !can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$", var.bucket_name)) &&
      !startswith(var.bucket_name, "xn--") &&
      !startswith(var.bucket_name, "sthree-") &&
      !endswith(var.bucket_name, "-s3alias") &&
      !endswith(var.bucket_name, "--ol-s3")
    )
    error_message = "bucket_name must not contain '..', look like an IP address, start with 'xn--' or 'sthree-', or end with '-s3alias' or '--ol-s3'."
  }

  validation {
    # Dots break virtual-hosted-style TLS (the wildcard certificate covers one label);
    # objcache always talks TLS to S3.
    condition     = !strcontains(var.bucket_name, ".")
    error_message = "bucket_name must not contain dots: virtual-hosted-style HTTPS requests to such buckets fail certificate validation."
  }
}

variable "prefix" {
  description = "Key prefix inside the bucket; objcache stores entries under <prefix>/v1/<env>/<kind>/<shard>/<key>. No leading or trailing slash."
  type        = string
  default     = "objcache"

  validation {
    # Restricted to characters that need no escaping in the OBJCACHE_TIERS URL.
    condition     = can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.prefix))
    error_message = "prefix must be one or more '/'-separated segments of letters, digits, '.', '_' or '-', without leading or trailing '/'."
  }
}

variable "expiration_days" {
  description = "Delete cache entries this many days after they were written (S3 counts from object creation, not last access)."
  type        = number
  default     = 30

  validation {
    condition     = var.expiration_days > 0 && floor(var.expiration_days) == var.expiration_days
    error_message = "expiration_days must be a whole number greater than 0."
  }
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Abort multipart uploads that are still incomplete this many days after they started, so their parts stop being billed."
  type        = number
  default     = 1

  validation {
    condition     = var.abort_incomplete_multipart_upload_days > 0 && floor(var.abort_incomplete_multipart_upload_days) == var.abort_incomplete_multipart_upload_days
    error_message = "abort_incomplete_multipart_upload_days must be a whole number greater than 0."
  }
}

variable "kms_key_arn" {
  description = "ARN of a customer-managed KMS key (key ARN, not alias: IAM grants on aliases do not authorize key use) for SSE-KMS with S3 Bucket Keys. null (default) uses SSE-S3 (AES256), which has no per-request KMS cost or quota."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be null or a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}

variable "versioning_enabled" {
  description = "Enable bucket versioning. Off by default: cache entries are reproducible and versioning only keeps deleted or overwritten entries billable."
  type        = bool
  default     = false
}

variable "noncurrent_version_expiration_days" {
  description = "When versioning is enabled, delete noncurrent versions this many days after they become noncurrent."
  type        = number
  default     = 1

  validation {
    condition     = var.noncurrent_version_expiration_days > 0 && floor(var.noncurrent_version_expiration_days) == var.noncurrent_version_expiration_days
    error_message = "noncurrent_version_expiration_days must be a whole number greater than 0."
  }
}

variable "force_destroy" {
  description = "Allow terraform destroy to delete the bucket while it still contains cache entries."
  type        = bool
  default     = false
}

variable "access_log_bucket" {
  description = "Name of an existing bucket that receives S3 server access logs for this bucket, or null (default) for no access logging."
  type        = string
  default     = null

  validation {
    condition     = var.access_log_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.access_log_bucket))
    error_message = "access_log_bucket must be null or a valid S3 bucket name."
  }
}

variable "name_prefix" {
  description = "Prefix for the names of the IAM policies (and roles) this module creates. Defaults to the bucket name."
  type        = string
  default     = null

  validation {
    condition     = var.name_prefix == null || can(regex("^[A-Za-z0-9+=,.@_-]{1,40}$", var.name_prefix))
    error_message = "name_prefix must be null or 1-40 characters valid in IAM names ([A-Za-z0-9+=,.@_-])."
  }
}

variable "reader_role" {
  description = <<-EOT
    Optional IAM role for the fleet (read-only consumers), with the reader policy attached.
    null (default) creates no role; attach reader_policy_arn to your own roles instead.
    trusted_services: AWS services allowed to assume it (EC2 instance profile by default).
    trusted_role_arns: IAM principals allowed to assume it (e.g. an EKS IRSA or node role).
    create_instance_profile: also create an EC2 instance profile for the role.
  EOT
  type = object({
    name                    = string
    trusted_services        = optional(list(string), ["ec2.amazonaws.com"])
    trusted_role_arns       = optional(list(string), [])
    create_instance_profile = optional(bool, true)
  })
  default = null

  validation {
    condition     = var.reader_role == null ? true : can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.reader_role.name))
    error_message = "reader_role.name must be 1-64 characters valid in IAM role names."
  }

  validation {
    condition     = var.reader_role == null ? true : length(concat(var.reader_role.trusted_services, var.reader_role.trusted_role_arns)) > 0
    error_message = "reader_role needs at least one trusted service or trusted role ARN."
  }

  validation {
    condition     = var.reader_role == null ? true : alltrue([for arn in var.reader_role.trusted_role_arns : can(regex("^arn:aws[a-zA-Z-]*:iam::[0-9]{12}:(role|user|root)", arn))])
    error_message = "reader_role.trusted_role_arns must be IAM ARNs (arn:aws:iam::<account>:role/...); wildcards are not accepted."
  }
}

variable "writer_role" {
  description = <<-EOT
    Optional IAM role for CI (the only writers), trusted through GitHub Actions OIDC, with the writer policy attached.
    null (default) creates no role; attach writer_policy_arn to your own CI role instead.
    github_oidc_provider_arn: ARN of the account's token.actions.githubusercontent.com OIDC provider.
    github_subjects: allowed "sub" claims, e.g. "repo:my-org/my-repo:ref:refs/heads/main" or "repo:my-org/my-repo:environment:preseed".
    max_session_duration: seconds, 3600-43200.
  EOT
  type = object({
    name                     = string
    github_oidc_provider_arn = string
    github_subjects          = list(string)
    max_session_duration     = optional(number, 3600)
  })
  default = null

  validation {
    condition     = var.writer_role == null ? true : can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.writer_role.name))
    error_message = "writer_role.name must be 1-64 characters valid in IAM role names."
  }

  validation {
    condition     = var.writer_role == null ? true : can(regex("^arn:aws[a-zA-Z-]*:iam::[0-9]{12}:oidc-provider/token\\.actions\\.githubusercontent\\.com$", var.writer_role.github_oidc_provider_arn))
    error_message = "writer_role.github_oidc_provider_arn must be the ARN of the token.actions.githubusercontent.com OIDC provider."
  }

  validation {
    # Any subject whose owner/repo part holds a wildcard lets workflows of other
    # repositories write to the cache, i.e. poison entries that the fleet unpickles.
    condition = var.writer_role == null ? true : (
      length(var.writer_role.github_subjects) > 0 &&
      alltrue([for s in var.writer_role.github_subjects : can(regex("^repo:[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+:.+$", s))])
    )
    error_message = "writer_role.github_subjects must be non-empty and each must start with repo:<owner>/<repo>: with no wildcard in owner or repo."
  }

  validation {
    condition     = var.writer_role == null ? true : (var.writer_role.max_session_duration >= 3600 && var.writer_role.max_session_duration <= 43200)
    error_message = "writer_role.max_session_duration must be between 3600 and 43200 seconds."
  }
}

variable "tags" {
  description = "Tags applied to every resource that supports them."
  type        = map(string)
  default     = {}
}
