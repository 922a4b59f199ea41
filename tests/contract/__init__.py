"""The backend contract suite: one set of tests run against every backend."""
