"""What the results' writer (module_utils on the hosts, the library modules) and their reader
(analysis/) share: names, flags, secrets, profiles, thresholds and the level files' kinds.
Standard library only, and nothing here imports another stage."""
