# One provider per region: a module call cannot take a provider chosen by for_each, so each
# regional bucket is its own module block. To add a region, add a provider alias here, a
# module block and a *_region variable, and list it in local.regional_tiers (main.tf).

# Default provider: the home region, which also manages the (global) IAM resources.
provider "aws" {
  region = var.home_region

  default_tags {
    tags = var.tags
  }
}

provider "aws" {
  alias  = "eu"
  region = var.eu_region

  default_tags {
    tags = var.tags
  }
}

provider "aws" {
  alias  = "apac"
  region = var.apac_region

  default_tags {
    tags = var.tags
  }
}
