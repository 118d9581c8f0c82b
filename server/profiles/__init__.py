"""Device profiles: the built-in priors and their calibrations from measured runs."""
