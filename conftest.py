"""Settings for every test in the repository."""

from hypothesis import settings

# No per-example deadline: on a loaded 2-core CI machine, with tests in parallel
# workers, an example's wall time says nothing about the code (a 200 ms deadline
# failed a 160 ms example that took 435 ms once). Pytest's own timeout still holds.
settings.register_profile("repo", deadline=None)
settings.load_profile("repo")
