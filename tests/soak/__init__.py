"""The chaos soak (issue 29): `make soak`, and a 60-second run in `make test`
(test_soak.py). tests/soak/runner.py says how it runs; docs/reliability.md has the figures."""
