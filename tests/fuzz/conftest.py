"""`make fuzz`: the same properties with 10,000+ examples each (``--hypothesis-profile=fuzz``)."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fuzz",
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("quick", max_examples=200, deadline=None)
settings.load_profile("quick")
