terraform {
  # optional() object attributes with defaults need 1.3; 1.5 is the oldest release we
  # support.
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # soft_delete_policy on google_storage_bucket needs 5.22; 6.x and 7.x keep the
      # arguments used here.
      version = ">= 5.22.0, < 8.0.0"
    }
  }
}
