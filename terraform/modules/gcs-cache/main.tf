# GCS tier for objcache: one dedicated bucket, entries under <prefix>/v1/<env>/<kind>/<shard>/<key>.
#
# CI writes, the fleet reads. Entries are pickles that torch loads, so write access to the
# bucket is code execution on every reader; keep writer_members small.

resource "google_storage_bucket" "this" {
  #checkov:skip=CKV_GCP_78:Versioning is off by default on purpose (var.versioning_enabled): entries are immutable, first-writer-wins and reproducible, so noncurrent versions would only keep deleted entries billable. It can be turned on.
  #checkov:skip=CKV_GCP_62:Usage logs are opt-in via var.access_log_bucket: they need a separate log bucket, and a log line per cache GET typically costs more than the cache. Use Data Access audit logs for audits.
  name          = var.bucket_name
  project       = var.project
  location      = upper(var.location)
  storage_class = var.storage_class
  force_destroy = var.force_destroy
  labels        = var.labels

  # IAM only, no object ACLs; never public, whatever the IAM policy says.
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"

  versioning {
    enabled = var.versioning_enabled
  }

  soft_delete_policy {
    retention_duration_seconds = var.soft_delete_retention_seconds
  }

  dynamic "custom_placement_config" {
    for_each = length(var.dual_region_locations) > 0 ? [1] : []
    content {
      data_locations = [for l in var.dual_region_locations : upper(l)]
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [1]
    content {
      default_kms_key_name = var.kms_key_name
    }
  }

  dynamic "logging" {
    for_each = var.access_log_bucket == null ? [] : [1]
    content {
      log_bucket        = var.access_log_bucket
      log_object_prefix = "gcs-usage/${var.bucket_name}"
    }
  }

  # Age counts from creation: objcache writes with if_generation_match=0 (first writer
  # wins), so a hot entry is not refreshed and is rebuilt by CI after expiration_days.
  lifecycle_rule {
    condition {
      age            = var.expiration_days
      matches_prefix = ["${var.prefix}/"]
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = var.abort_incomplete_multipart_upload_days
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }

  dynamic "lifecycle_rule" {
    for_each = var.versioning_enabled ? [1] : []
    content {
      condition {
        days_since_noncurrent_time = var.noncurrent_version_expiration_days
        with_state                 = "ARCHIVED"
      }
      action {
        type = "Delete"
      }
    }
  }
}

# Non-authoritative bindings: other members of these roles on the bucket are left alone.
# Members must be known at plan time (for_each keys): build service-account emails from
# strings rather than from a google_service_account created in the same apply.

# Readers (the fleet): roles/storage.objectViewer = storage.objects.get + storage.objects.list.
# objects.list matters beyond listing: with it a missing key is a 404 (a miss), not a 403.
resource "google_storage_bucket_iam_member" "reader" {
  for_each = toset(var.reader_members)

  bucket = google_storage_bucket.this.name
  role   = "roles/storage.objectViewer"
  member = each.value
}

# Writers (CI): objcache needs create (put), get, list and delete (objcache gc, and
# overwrite-mode puts replace an existing object, which GCS authorizes as a delete).
# roles/storage.objectCreator + objectViewer lacks delete, so gc would fail;
# roles/storage.objectUser is the smallest predefined role with all four.
resource "google_storage_bucket_iam_member" "writer" {
  for_each = toset(var.writer_members)

  bucket = google_storage_bucket.this.name
  role   = var.writer_role
  member = each.value
}
