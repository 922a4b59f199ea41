output "fleet_tiers_by_region" {
  description = "Region => OBJCACHE_TIERS for fleet machines in that region, nearest bucket first and the home bucket last. Use with OBJCACHE_READ_ONLY=1."
  value       = local.fleet_tiers
}

output "ci_tiers" {
  description = "OBJCACHE_TIERS for CI: every bucket, home first, so each entry CI builds is uploaded to all regions."
  value       = local.ci_tiers
}

output "bucket_names" {
  description = "Region => cache bucket name."
  value = {
    (var.home_region) = module.home.bucket_name
    (var.eu_region)   = module.eu.bucket_name
    (var.apac_region) = module.apac.bucket_name
  }
}

output "writer_policy_arns" {
  description = "Region => writer policy ARN. Attach all of them to the CI role only."
  value       = local.writer_policy_arns
}

output "fleet_role_arn" {
  description = "ARN of the fleet role (read-only on every bucket)."
  value       = aws_iam_role.fleet.arn
}

output "fleet_instance_profile_name" {
  description = "EC2 instance profile to launch fleet machines with."
  value       = aws_iam_instance_profile.fleet.name
}
