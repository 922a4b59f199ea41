output "bucket_name" {
  description = "Name of the cache bucket."
  value       = google_storage_bucket.this.name
}

output "bucket_url" {
  description = "gs:// URL of the bucket itself (without the prefix)."
  value       = google_storage_bucket.this.url
}

output "location" {
  description = "Location of the bucket as GCS reports it (upper case)."
  value       = google_storage_bucket.this.location
}

output "prefix" {
  description = "Key prefix objcache uses inside the bucket."
  value       = var.prefix
}

output "tiers_fragment" {
  description = "This bucket as one OBJCACHE_TIERS entry: gs://<bucket>/<prefix>. Join fragments with ',' nearest tier first."
  value       = "gs://${google_storage_bucket.this.name}/${var.prefix}"
}

output "reader_role" {
  description = "Role granted to reader_members."
  value       = "roles/storage.objectViewer"
}

output "writer_role" {
  description = "Role granted to writer_members."
  value       = var.writer_role
}
