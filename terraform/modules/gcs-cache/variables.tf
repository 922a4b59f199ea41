variable "project" {
  description = "Google Cloud project that owns the bucket. null uses the provider's project."
  type        = string
  default     = null

  validation {
    condition     = var.project == null || can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be null or a project ID (6-30 lowercase letters, digits and hyphens)."
  }
}

variable "bucket_name" {
  description = "Name of the GCS bucket that holds the cache. Globally unique; the bucket is meant to be dedicated to objcache."
  type        = string

  validation {
    # Dotted names need domain verification; plain names: 3-63 chars of lowercase
    # letters, digits, '-' and '_', starting and ending with a letter or digit.
    condition     = can(regex("^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of lowercase letters, digits, '-' and '_', starting and ending with a letter or digit (no dots)."
  }

  validation {
    condition     = !startswith(var.bucket_name, "goog") && !strcontains(var.bucket_name, "google")
    error_message = "bucket_name must not start with 'goog' or contain 'google'."
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

variable "location" {
  description = "Bucket location: a region (us-central1, europe-west4), a predefined dual-region (NAM4, EUR4) or a multi-region (US, EU, ASIA). For a configurable dual-region set a multi-region here and the two regions in dual_region_locations."
  type        = string

  validation {
    condition     = length(trimspace(var.location)) > 0
    error_message = "location must not be empty."
  }

  validation {
    condition     = can(regex("^[A-Za-z0-9-]+$", var.location))
    error_message = "location must be a single GCS location name such as us-central1, NAM4 or EU."
  }
}

variable "dual_region_locations" {
  description = "The two regions of a configurable dual-region (custom_placement_config), e.g. [\"us-east1\", \"us-east4\"] with location = \"US\". Empty (default) for a region, predefined dual-region or multi-region."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.dual_region_locations) == 0 || length(var.dual_region_locations) == 2
    error_message = "dual_region_locations must be empty or name exactly two regions."
  }
}

variable "storage_class" {
  description = "Storage class. STANDARD (default) suits a cache: the colder classes bill minimum storage durations and retrieval, which a churning cache pays on every read and expiry."
  type        = string
  default     = "STANDARD"

  validation {
    condition     = contains(["STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE"], var.storage_class)
    error_message = "storage_class must be STANDARD, NEARLINE, COLDLINE or ARCHIVE."
  }
}

variable "expiration_days" {
  description = "Delete cache entries this many days after they were written (GCS counts age from object creation)."
  type        = number
  default     = 30

  validation {
    condition     = var.expiration_days > 0 && floor(var.expiration_days) == var.expiration_days
    error_message = "expiration_days must be a whole number greater than 0."
  }
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Abort XML-API multipart uploads still incomplete after this many days (resumable JSON-API uploads expire by themselves after a week)."
  type        = number
  default     = 1

  validation {
    condition     = var.abort_incomplete_multipart_upload_days > 0 && floor(var.abort_incomplete_multipart_upload_days) == var.abort_incomplete_multipart_upload_days
    error_message = "abort_incomplete_multipart_upload_days must be a whole number greater than 0."
  }
}

variable "soft_delete_retention_seconds" {
  description = "Soft-delete retention. 0 (default) disables soft delete: GCS otherwise keeps every expired or gc-deleted entry billable for 7 days, which for a churning cache can cost as much as the live data. Otherwise 604800-7776000."
  type        = number
  default     = 0

  validation {
    condition     = var.soft_delete_retention_seconds == 0 || (var.soft_delete_retention_seconds >= 604800 && var.soft_delete_retention_seconds <= 7776000)
    error_message = "soft_delete_retention_seconds must be 0 or between 604800 (7 days) and 7776000 (90 days)."
  }
}

variable "versioning_enabled" {
  description = "Enable object versioning. Off by default: cache entries are reproducible and versioning only keeps deleted or overwritten entries billable."
  type        = bool
  default     = false
}

variable "noncurrent_version_expiration_days" {
  description = "When versioning is enabled, delete noncurrent versions this many days after they became noncurrent."
  type        = number
  default     = 1

  validation {
    condition     = var.noncurrent_version_expiration_days > 0 && floor(var.noncurrent_version_expiration_days) == var.noncurrent_version_expiration_days
    error_message = "noncurrent_version_expiration_days must be a whole number greater than 0."
  }
}

variable "kms_key_name" {
  description = "Cloud KMS key (projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>) for CMEK default encryption, or null (default) for Google-managed encryption. The GCS service agent needs roles/cloudkms.cryptoKeyEncrypterDecrypter on it."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.kms_key_name))
    error_message = "kms_key_name must be null or projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>."
  }
}

variable "access_log_bucket" {
  description = "Name of an existing bucket that receives usage logs for this bucket, or null (default) for no usage logs."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Allow terraform destroy to delete the bucket while it still contains cache entries."
  type        = bool
  default     = false
}

variable "labels" {
  description = "Labels applied to the bucket."
  type        = map(string)
  default     = {}
}

variable "reader_members" {
  description = "IAM members of the fleet (read-only), e.g. [\"serviceAccount:fleet@my-project.iam.gserviceaccount.com\"]. Granted roles/storage.objectViewer on the bucket."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.reader_members : can(regex("^(serviceAccount|group|principal|principalSet|user|domain):.+$", m))])
    error_message = "reader_members must be IAM member strings such as serviceAccount:<email>; allUsers and allAuthenticatedUsers are not accepted."
  }
}

variable "writer_members" {
  description = "IAM members of CI (read-write), e.g. [\"serviceAccount:ci@my-project.iam.gserviceaccount.com\"] or a workload identity principalSet://... Granted writer_role on the bucket."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.writer_members : can(regex("^(serviceAccount|group|principal|principalSet|user):.+$", m))])
    error_message = "writer_members must be IAM member strings such as serviceAccount:<email>; allUsers, allAuthenticatedUsers and domain: are not accepted for writers."
  }
}

variable "writer_role" {
  description = "Role granted to writer_members. roles/storage.objectUser (default) is the smallest predefined role with create, get, list and delete on objects; roles/storage.objectAdmin adds object IAM and ACL management that objcache never uses."
  type        = string
  default     = "roles/storage.objectUser"

  validation {
    condition     = contains(["roles/storage.objectUser", "roles/storage.objectAdmin"], var.writer_role)
    error_message = "writer_role must be roles/storage.objectUser or roles/storage.objectAdmin: objcache writers need create, read, list and delete."
  }
}
