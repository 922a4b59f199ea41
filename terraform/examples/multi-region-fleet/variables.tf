variable "bucket_name_prefix" {
  description = "Bucket names are <bucket_name_prefix>-<region>; pick something globally unique such as <company>-objcache."
  type        = string

  validation {
    # Leaves room for "-<region>" (up to 15 characters) within the 63-character limit.
    condition     = can(regex("^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$", var.bucket_name_prefix))
    error_message = "bucket_name_prefix must be 3-40 lowercase letters, digits and hyphens, starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix inside every bucket."
  type        = string
  default     = "objcache"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.prefix))
    error_message = "prefix must be '/'-separated segments of letters, digits, '.', '_' or '-', without leading or trailing '/'."
  }
}

variable "home_region" {
  description = "Region of the home bucket that every fleet reads last (and where the IAM resources are managed)."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.home_region))
    error_message = "home_region must be an AWS region name such as us-east-1."
  }
}

variable "eu_region" {
  description = "Region of the first regional bucket."
  type        = string
  default     = "eu-west-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.eu_region))
    error_message = "eu_region must be an AWS region name such as eu-west-1."
  }
}

variable "apac_region" {
  description = "Region of the second regional bucket."
  type        = string
  default     = "ap-northeast-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.apac_region))
    error_message = "apac_region must be an AWS region name such as ap-northeast-1."
  }
}

variable "home_expiration_days" {
  description = "Days before entries in the home bucket expire."
  type        = number
  default     = 30

  validation {
    condition     = var.home_expiration_days > 0 && floor(var.home_expiration_days) == var.home_expiration_days
    error_message = "home_expiration_days must be a whole number greater than 0."
  }
}

variable "regional_expiration_days" {
  description = "Days before entries in the regional buckets expire. Shorter than the home bucket: a regional miss still hits home, only slower."
  type        = number
  default     = 14

  validation {
    condition     = var.regional_expiration_days > 0 && floor(var.regional_expiration_days) == var.regional_expiration_days
    error_message = "regional_expiration_days must be a whole number greater than 0."
  }
}

variable "fleet_role_name" {
  description = "Name of the fleet's IAM role and EC2 instance profile (read-only on every bucket)."
  type        = string
  default     = "objcache-fleet"

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
