output "ci_role_arn" {
  description = "role-to-assume for aws-actions/configure-aws-credentials in the pre-seeding workflow."
  value       = module.cache.writer_role_arn
}

output "fleet_instance_profile_name" {
  description = "EC2 instance profile for fleet machines (read-only)."
  value       = module.cache.reader_instance_profile_name
}

output "objcache_tiers" {
  description = "OBJCACHE_TIERS value for both CI and the fleet."
  value       = module.cache.tiers_fragment
}

output "ci_environment" {
  description = "Environment for the CI pre-seeding job. Also set OBJCACHE_JOB per model, to the same value the fleet uses, so the fleet prefetches what CI recorded."
  value = merge(
    { OBJCACHE_TIERS = module.cache.tiers_fragment },
    # The job writes the secret (signing_key_secret_arn) to this path, mode 0600.
    var.signing_key_secret_arn == null ? {} : { OBJCACHE_SIGNING_KEY_FILE = "/run/secrets/objcache-ci.pem" },
  )
}

output "fleet_environment" {
  description = "Environment for fleet machines: the same tiers, read-only, and the public keys every entry must be signed with."
  value = merge(
    {
      OBJCACHE_TIERS     = module.cache.tiers_fragment
      OBJCACHE_READ_ONLY = "1"
    },
    length(var.verify_keys) == 0 ? {} : { OBJCACHE_VERIFY_KEYS = join(",", var.verify_keys) },
  )
}
