terraform {
  # optional() object attributes with defaults need 1.3; 1.5 is the oldest release we
  # support. Validation blocks only reference their own variable (cross-variable
  # validation would need 1.9).
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # auth_token_update_strategy exists since 5.27 and must be set explicitly with an
      # auth_token from 6.0 on, so the module always sets it.
      version = ">= 5.50.0, < 7.0.0"
    }
  }
}
